"""The losses of domain adaptation against sentence-transformers' own: MarginMSE (GPL's objective,
--method margin-mse) is MarginMSELoss (dot product and cosine), supervised SimCSE on (query,
positive) pairs without hard negatives (GenQ's training) is MultipleNegativesRankingLoss, loss and
gradient on the same vectors; the margins file read and refused; both end to end on the tiny BERT
through run_pretrain.py, --mini-batch-size included."""
from __future__ import annotations

import json

import pytest
import torch
from helpers import CONTRADICTED, ENTAILED, PREMISES, base_args, load, run_quiet, stacked
from sentence_transformers.sentence_transformer.losses import MarginMSELoss, MultipleNegativesRankingLoss
from sentence_transformers.util import cos_sim, pairwise_cos_sim, pairwise_dot_score

from bertcf.data import beir
from bertcf.data.negatives import read_margins, write_margins
from bertcf.data.pairs import pair_kind, read_pairs
from bertcf.errors import DataError, UsageError
from bertcf.objectives import MarginMSE, SupervisedSimCSE
from bertcf.objectives.margin_mse import margin_mse

pytestmark = pytest.mark.usefixtures("one_thread")
SIMILARITY = {"dot": pairwise_dot_score, "cos": pairwise_cos_sim}


def columns(b=8, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, d, generator=g) for _ in range(3)], torch.randn(b, generator=g) * 3


def loss_and_grads(loss_fn, tensors):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    loss = loss_fn(leaves)
    loss.backward()
    return loss.detach(), [t.grad for t in leaves]


def assert_same(ours, theirs):
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("score", ["dot", "cos"])
def test_margin_mse_is_sentence_transformers_margin_mse_loss(score):
    vectors, margins = columns()
    theirs = loss_and_grads(lambda v: MarginMSELoss(None, similarity_fct=SIMILARITY[score])
                            .compute_loss_from_embeddings(v, margins), vectors)
    ours = loss_and_grads(lambda v: margin_mse(*v, margins, score), vectors)
    assert_same(ours, theirs)
    assert theirs[0] > 0


def test_margin_mse_by_hand():
    """Two rows: q.p+ = 2, q.p- = 1, margin 3 -> (1 - 3)^2 = 4; q.p+ = 0, q.p- = 1, margin -1 -> 0."""
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    pos, neg = torch.tensor([[2.0, 5.0], [7.0, 0.0]]), torch.tensor([[1.0, 9.0], [0.0, 1.0]])
    assert margin_mse(q, pos, neg, torch.tensor([3.0, -1.0])).item() == pytest.approx(2.0)


def captured(objective, batch, labels=None):
    """(our loss, the vectors [3 b, D] it came from, the loss's gradient on them)."""
    kept, embed = [], objective.embed

    def capture(*args, **kwargs):
        out = embed(*args, **kwargs)
        out.retain_grad()
        kept.append(out)
        return out
    objective.embed = capture
    loss, _ = objective.loss(*batch, labels=labels)
    loss.backward()
    return loss.detach(), kept[0].detach(), kept[0].grad


@pytest.mark.parametrize("score", ["dot", "cos"])
def test_the_objective_is_their_loss_on_the_encoders_vectors(tiny_bert_dir, score):
    encoder = load(tiny_bert_dir)
    objective = MarginMSE(encoder, margin_score=score)
    margins = torch.tensor([0.5, 2.0, -1.0, 0.25])
    loss, vectors, grad = captured(objective, stacked(encoder, [PREMISES, ENTAILED, CONTRADICTED]), margins)
    theirs = loss_and_grads(lambda v: MarginMSELoss(None, similarity_fct=SIMILARITY[score])
                            .compute_loss_from_embeddings(list(v[0].chunk(3)), margins), [vectors])
    assert_same((loss, [grad]), theirs)
    with pytest.raises(UsageError, match="needs each row's margin"):
        objective.loss(*stacked(encoder, [PREMISES, ENTAILED, CONTRADICTED]))


def test_simcse_sup_on_pairs_is_mnrl(tiny_bert_dir):
    """(query, positive) pairs, no hard negative, --negatives simcse: MNRL at scale 1/0.05."""
    encoder = load(tiny_bert_dir)
    objective = SupervisedSimCSE(encoder, negatives="simcse", temperature=0.05, hard_negatives=False)
    loss, vectors, grad = captured(objective, stacked(encoder, [PREMISES, ENTAILED]))
    mnrl = MultipleNegativesRankingLoss(None, scale=20.0, similarity_fct=cos_sim)
    theirs = loss_and_grads(lambda v: mnrl.compute_loss_from_embeddings(list(v[0].chunk(2)), None), [vectors])
    assert_same((loss, [grad]), theirs)


def test_pair_files_and_beir_sets_train_simcse_sup_without_negatives(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("query\tpositive\n" + "".join(f"{q}\t{p}\n" for q, p in zip(PREMISES, ENTAILED)))
    beir.write(tmp_path / "set", {f"d{i}": p for i, p in enumerate(ENTAILED)},
               {f"q{i}": q for i, q in enumerate(PREMISES[:3])}, {f"q{i}": {f"d{i}": 1} for i in range(3)},
               split="train")
    assert (pair_kind(pairs), pair_kind(tmp_path / "set")) == ("pairs", "beir")
    config = type("Config", (), {"method": "simcse-sup", "train_file": [str(pairs), str(tmp_path / "set")]})
    examples = SupervisedSimCSE.read_examples(config, None)
    assert examples.columns == [PREMISES + PREMISES[:3], ENTAILED + ENTAILED[:3]]
    assert SupervisedSimCSE.from_examples(examples) == {"hard_negatives": False}
    with pytest.raises(DataError, match="trains on its qrels/train.tsv"):
        pair_kind(tmp_path)  # a directory without qrels/train.tsv


def margin_rows(n=8):
    return [(PREMISES[i % 4], ENTAILED[i % 4], CONTRADICTED[(i + 1) % 4], 0.1 * i - 0.35) for i in range(n)]


def test_the_margins_file_round_trips_and_refuses_bad_rows(tmp_path):
    path = tmp_path / "margins.tsv"
    rows = margin_rows() + [("q\twith a tab", "p", "n", 1 / 3)]
    write_margins(path, rows)
    assert read_margins(path) == margin_rows() + [("q with a tab", "p", "n", 1 / 3)]  # margins bit for bit
    assert pair_kind(path) == "margins"
    with pytest.raises(DataError, match="margin-mse trains on, not labelled pairs"):
        read_pairs([path])
    bad = tmp_path / "bad.tsv"
    for body, message in (("query\tpositive\tnegative\tmargin\na\tb\tc\tx\n", "line 2: expected"),
                          ("query\tpositive\tnegative\tmargin\na\tb\tc\tnan\n", "the margin a finite number"),
                          ("query\tpositive\tnegative\tmargin\na\t\tc\t1\n", "line 2"),
                          ("query\tpositive\tnegative\n", "line 1: expected the header"),
                          ("query\tpositive\tnegative\tmargin\n", "holds no")):
        bad.write_text(body)
        with pytest.raises(DataError, match=message):
            read_margins(bad)
    with pytest.raises(DataError, match="no margins to write"):
        write_margins(tmp_path / "none.tsv", [])


def test_margin_mse_end_to_end_and_with_the_gradient_cache(tiny_bert_dir, data_dir, tmp_path):
    """run_pretrain.py --stage supervised --method margin-mse trains the encoder on a margins file;
    --mini-batch-size 2 gives the weights of the whole batch at once (without dropout, whose masks differ)."""
    path = tmp_path / "margins.tsv"
    write_margins(path, margin_rows())
    flags = dict(stage="supervised", method="margin-mse", train_file=path, corpus=None, lr=1e-3, dropout=0)
    summary, _ = run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "run", steps=3, **flags))
    assert summary["step"] == 3
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["method"], config["margin_score"], config["batch_sampler"]) == ("margin-mse", "dot", "random")
    cached, _ = run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "cached", steps=3, mini_batch_size=2, **flags))
    start, trained, same = (load(d).bert.encoder.layer[0].output.dense.weight
                            for d in (tiny_bert_dir, tmp_path / "run" / "last", tmp_path / "cached" / "last"))
    assert not torch.equal(trained, start)
    torch.testing.assert_close(same, trained, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flags,message", [
    (dict(method="margin-mse"), "needs --train-file"),
    (dict(method="margin-mse", train_file="NLI"), "trains on files of query<TAB>positive<TAB>negative<TAB>margin"),
    (dict(method="simcse-sup", train_file="MARGINS"), r"simcse-sup trains on .* \(margins\)"),
    (dict(method="cosent", margin_score="cos"), "--margin-score is a setting of margin-mse, not of cosent"),
])
def test_bad_flags_and_files(flags, message, tiny_bert_dir, data_dir, tmp_path):
    nli = tmp_path / "nli.tsv"
    nli.write_text("premise\thypothesis\tlabel\n" + "".join(f"{p}\t{h}\t0\n" for p, h in zip(PREMISES, ENTAILED)))
    write_margins(tmp_path / "margins.tsv", margin_rows())
    names = {"NLI": nli, "MARGINS": tmp_path / "margins.tsv"}
    flags = {k: names.get(v, v) for k, v in flags.items()}
    with pytest.raises(UsageError, match=message):
        run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "bad", stage="supervised", corpus=None, **flags))
