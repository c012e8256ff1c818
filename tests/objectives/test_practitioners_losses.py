"""CoSENT, AnglE and Matryoshka against sentence-transformers' own losses (CoSENTLoss, AnglELoss,
MatryoshkaLoss around MultipleNegativesRankingLoss, CosineSimilarityLoss and MSELoss): the same
loss and the same gradient on the same vectors; the objectives end to end on the tiny BERT."""
from __future__ import annotations

import pytest
import torch
from sentence_transformers import util
from sentence_transformers.sentence_transformer import losses

from bertcf.errors import UsageError
from bertcf.models.encoder import SentenceEncoder
from bertcf.objectives import AnglE, CoSENT, Distill, SBERTCosine, SimCSE, SupervisedSimCSE
from bertcf.objectives.cosent import angle_similarity, ranking_loss
from bertcf.objectives.settings import MatryoshkaSettings


class Precomputed(torch.nn.Module):
    """A stand-in for a SentenceTransformer whose columns' vectors are given: sentence-transformers'
    losses run on exactly the vectors ours run on."""

    def __init__(self, columns):
        super().__init__()
        self.columns = columns

    def forward(self, features):
        return {"sentence_embedding": self.columns[features["column"]]}

    def get_embedding_dimension(self):
        return self.columns[0].shape[-1]


def leaves(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def theirs_and_ours(their_loss, columns, labels, our_loss):
    """(their loss, ours) and the gradients of both on every column."""
    ours_cols = [c.detach().clone().requires_grad_() for c in columns]
    theirs = their_loss([{"column": i} for i in range(len(columns))], labels)
    theirs.backward()
    ours = our_loss(ours_cols)
    ours.backward()
    return theirs, ours, [c.grad for c in columns], [c.grad for c in ours_cols]


def assert_same(theirs, ours, their_grads, our_grads):
    """Loss and gradients equal up to float32 rounding. The gradients' absolute tolerance follows
    their scale (1e-5 of the largest element): a scaled logsumexp over b x b pairs sums terms in
    another order in each implementation and under each CPU instruction set (ATEN_CPU_CAPABILITY
    default gave 5.6e-6 at a gradient of 0.41 whose tensor reaches 3.9); a wrong gradient is off by
    that scale itself."""
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-6)
    for a, b in zip(their_grads, our_grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=max(1e-6, 1e-5 * a.abs().max().item()))


@pytest.mark.parametrize("scale", [20.0, 7.5])
@pytest.mark.parametrize("ties", [False, True])
def test_cosent_and_angle_equal_sentence_transformers(scale, ties):
    u, v = leaves((12, 16), (12, 16))
    gold = torch.tensor([0.0, 0.2, 0.2, 1.0, 0.6, 0.6, 0.4, 0.8, 0.0, 1.0, 0.2, 0.6]) if ties else torch.rand(
        12, generator=torch.Generator().manual_seed(1))
    for their_class, similarity in ((losses.CoSENTLoss, lambda a, b: torch.cosine_similarity(a, b)),
                                    (losses.AnglELoss, angle_similarity)):
        model = Precomputed([u, v])
        u.grad = v.grad = None
        got = theirs_and_ours(their_class(model, scale=scale), [u, v], gold,
                              lambda c: ranking_loss(similarity(*c), gold, scale))
        assert_same(*got)


def test_the_ranking_loss_by_hand():
    """Two pairs, gold 1 > 0, scores 0.5 and 0.8: log(1 + exp(20 (0.8 - 0.5)))."""
    loss = ranking_loss(torch.tensor([0.5, 0.8]), torch.tensor([1.0, 0.0]), 20.0)
    assert loss.item() == pytest.approx(float(torch.log1p(torch.exp(torch.tensor(6.0)))), rel=1e-6)
    assert ranking_loss(torch.tensor([0.5, 0.8]), torch.tensor([0.3, 0.3]), 20.0).item() == 0.0  # no order


def test_angle_similarity_of_an_odd_width_pads_as_theirs():
    u, v = leaves((5, 7), (5, 7))
    torch.testing.assert_close(angle_similarity(u, v), util.pairwise_angle_sim(u, v), rtol=1e-6, atol=1e-6)


DIMS, WEIGHTS = (16, 8, 4), (1.0, 0.5, 0.25)


def matryoshka(dims=DIMS, weights=WEIGHTS):
    return MatryoshkaSettings(matryoshka_dims=dims, matryoshka_weights=weights)


@pytest.mark.parametrize("weights", [None, WEIGHTS])
def test_matryoshka_around_in_batch_negatives_equals_theirs(tiny_bert_dir, weights):
    """Supervised SimCSE's published loss (--negatives simcse) is MultipleNegativesRankingLoss with
    hard negatives (scale 20 = temperature 0.05)."""
    dims, weights = (32, *DIMS), None if weights is None else (1.0, *weights)  # the model's own width too
    objective = SupervisedSimCSE(SentenceEncoder.from_pretrained(tiny_bert_dir), negatives="simcse",
                                 matryoshka_dims=dims, matryoshka_weights=weights)
    columns = leaves((6, 32), (6, 32), (6, 32))
    model = Precomputed(columns)
    their = losses.MatryoshkaLoss(model, losses.MultipleNegativesRankingLoss(model), list(dims),
                                  None if weights is None else list(weights))
    assert_same(*theirs_and_ours(their, columns, torch.zeros(6),
                                 lambda c: objective.at_widths(lambda v, _: objective.info_nce(*v), c)))


def test_matryoshka_around_cosine_regression_and_cosent_equals_theirs(tiny_bert_dir):
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    gold = torch.rand(8, generator=torch.Generator().manual_seed(3))
    for ours_class, their_class in ((SBERTCosine, losses.CosineSimilarityLoss), (CoSENT, losses.CoSENTLoss),
                                    (AnglE, losses.AnglELoss)):
        objective = ours_class(encoder, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS)
        columns = leaves((8, 32), (8, 32), seed=4)
        model = Precomputed(columns)
        their = losses.MatryoshkaLoss(model, their_class(model), list(DIMS), list(WEIGHTS))
        def ours(c):
            return objective.at_widths(lambda w, y: objective.pair_loss(*w, y), c, gold)
        assert_same(*theirs_and_ours(their, columns, gold, ours))


def test_matryoshka_around_distillation_cuts_the_teachers_vectors_as_theirs(tiny_bert_dir):
    """MSELoss under MatryoshkaLoss: the student's vectors cut and normalised, the teacher's cut."""
    objective = Distill(SentenceEncoder.from_pretrained(tiny_bert_dir), width=16, matryoshka_dims=(16, 8))
    (student,) = leaves((6, 16), seed=5)
    teacher = torch.randn(6, 16, generator=torch.Generator().manual_seed(6))
    model = Precomputed([student])
    their = losses.MatryoshkaLoss(model, losses.MSELoss(model), [16, 8])
    assert_same(*theirs_and_ours(their, [student], teacher, lambda c: objective.at_widths(
        lambda s, t: torch.stack([torch.nn.functional.mse_loss(x, t) for x in s]).mean(), c, teacher)))


def test_matryoshka_settings_are_checked(tiny_bert_dir):
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    with pytest.raises(UsageError, match="--matryoshka-dims 64 is wider than the 32 dimensions"):
        SimCSE(encoder, matryoshka_dims=(64, 16))
    with pytest.raises(UsageError, match="gives 1 weights for 2 --matryoshka-dims"):
        SimCSE(encoder, matryoshka_dims=(32, 16), matryoshka_weights=(1.0,))
    with pytest.raises(UsageError, match="matryoshka_dims must be comma-separated distinct widths"):
        SimCSE(encoder, matryoshka_dims=(16, 16))
    objective = SimCSE(encoder, matryoshka_dims=(32, 16))
    assert encoder.matryoshka_dims is None  # the encoder given is left as it is; the Trainer records the widths
    ids = encoder.tokenize(["a man plays a guitar", "a dog runs", "the cat sleeps"])
    special = torch.isin(ids["input_ids"], torch.tensor(encoder.tokenizer.all_special_ids))
    loss, _ = objective(ids["input_ids"], ids["attention_mask"], special)
    assert torch.isfinite(loss)
