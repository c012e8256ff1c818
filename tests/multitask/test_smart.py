"""SMART (bertcf.multitask.smart) against smart-pytorch's SMARTLoss (a test dependency), on the same
inputs and the same noise and dropout draws (torch seeded alike before each): the same value and
the same gradients on the model's parameters and on the input embeddings, for classification
(symmetric KL), regression (squared error), several tasks at once, and a tiny minBERT run from
``inputs_embeds``."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bertcf.errors import UsageError
from bertcf.models.encoder import SentenceEncoder
from bertcf.multitask.smart import (SMARTLoss, binary_sym_kl_loss, check_smart_weight, squared_error_loss,
                                    sym_kl_loss)

smart_pytorch = pytest.importorskip("smart_pytorch", reason="smart-pytorch is in the test extra")


class Tagger(nn.Module):
    """Embeddings [b, t, D] -> a mean-pooled, dropped-out representation and two heads: five
    classes and a score."""

    def __init__(self, dim=16, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.mix = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Dropout(0.2))
        self.classes, self.score = nn.Linear(dim, 5), nn.Linear(dim, 1)

    def forward(self, embed):
        h = self.mix(embed).mean(1)
        return {"logits": self.classes(h), "score": self.score(h).squeeze(1)}


def embeddings(b=6, t=7, dim=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, t, dim, generator=g) * 0.3).requires_grad_()


def value_and_grads(make_loss, model, embed, seed):
    """One forward with torch seeded: the regulariser's value and its gradients on the model's
    parameters and on the embeddings."""
    torch.manual_seed(seed)
    value = make_loss()
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(value, params + [embed], allow_unused=True)
    return value.detach(), grads


def assert_same(ours, theirs):
    (v1, g1), (v2, g2) = ours, theirs
    assert torch.allclose(v1, v2, rtol=1e-6, atol=0), (v1, v2)
    assert v1 > 0
    for a, b in zip(g1, g2):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-7 * b.abs().max().item())


@pytest.mark.parametrize("settings", [{}, {"num_steps": 2, "step_size": 1e-2, "noise_var": 1e-3}],
                         ids=["defaults", "two-steps"])
@pytest.mark.parametrize("reduction", ["sum", "batchmean"])
def test_classification_sym_kl_matches_smart_pytorch(settings, reduction):
    model, embed = Tagger(), embeddings()
    model.train()  # dropout on: the same draws in both

    def eval_fn(e):
        return model(e)["logits"]

    def ours():
        state = eval_fn(embed)
        return SMARTLoss(eval_fn, lambda p, c: sym_kl_loss(p, c, reduction), **settings)(embed, state)

    def theirs():
        state = eval_fn(embed)
        loss = lambda p, c: smart_pytorch.sym_kl_loss(p, c, reduction=reduction)  # noqa: E731
        return smart_pytorch.SMARTLoss(eval_fn, loss, **settings)(embed, state)

    assert_same(value_and_grads(ours, model, embed, 3), value_and_grads(theirs, model, embed, 3))


def test_regression_squared_error_matches_smart_pytorch():
    model, embed = Tagger(seed=2), embeddings(seed=4)

    def eval_fn(e):
        return model(e)["score"]

    settings = {"num_steps": 1, "step_size": 1e-1, "noise_var": 1e-2}

    def ours():
        return SMARTLoss(eval_fn, squared_error_loss, **settings)(embed, eval_fn(embed))

    def theirs():
        return smart_pytorch.SMARTLoss(eval_fn, F.mse_loss, **settings)(embed, eval_fn(embed))

    assert_same(value_and_grads(ours, model, embed, 5), value_and_grads(theirs, model, embed, 5))


def test_the_steps_move_the_noise():
    """The steps matter: with them the value differs from the initial noise's alone (num_steps=0),
    and it is larger: the noise climbed the divergence."""
    model, embed = Tagger(), embeddings()
    model.eval()

    def eval_fn(e):
        return model(e)["logits"]

    values = []
    for steps in (0, 1):
        torch.manual_seed(0)
        values.append(SMARTLoss(eval_fn, sym_kl_loss, num_steps=steps, noise_var=1e-3)(embed, eval_fn(embed)))
    assert values[1] > 10 * values[0]


def test_dict_outputs_one_perturbation_for_all_tasks():
    """Per-task losses on a dict of outputs equal smart-pytorch on the outputs concatenated into one
    tensor with the per-task losses summed on its parts."""
    model, embed = Tagger(seed=6), embeddings(seed=7)
    settings = {"num_steps": 1, "step_size": 1e-2, "noise_var": 1e-3}

    def ours():
        loss_fns = {"logits": sym_kl_loss, "score": lambda p, c: 3.0 * squared_error_loss(p, c)}
        return SMARTLoss(model, loss_fns, **settings)(embed, model(embed))

    def theirs():
        def eval_fn(e):
            out = model(e)
            return torch.cat([out["logits"], out["score"][:, None]], dim=1)

        def loss(p, c):
            return (smart_pytorch.sym_kl_loss(p[:, :5], c[:, :5], reduction="batchmean")
                    + 3.0 * F.mse_loss(p[:, 5], c[:, 5]))

        return smart_pytorch.SMARTLoss(eval_fn, loss, **settings)(embed, eval_fn(embed))

    assert_same(value_and_grads(ours, model, embed, 8), value_and_grads(theirs, model, embed, 8))


def test_tiny_minbert_from_inputs_embeds(tiny_bert_dir):
    """The real case: SentenceEncoder's forward from word embeddings (``inputs_embeds``, through
    ``embed`` and ``pooled`` to minBERT) on a padded batch, dropout on, a five-class head."""
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    encoder.train()
    torch.manual_seed(0)
    head = nn.Linear(encoder.output_dim, 5)
    tokens = encoder.tokenize(["a short one", "a sentence that is quite a bit longer", "three"])
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    assert (mask == 0).any()
    with torch.no_grad():
        assert torch.equal(encoder.eval()(ids, mask, inputs_embeds=encoder.bert.embeddings.word_embeddings(ids)),
                           encoder(ids, mask))
    encoder.train()
    model = nn.ModuleDict({"encoder": encoder, "head": head})
    settings = {"num_steps": 1, "step_size": 1e-2, "noise_var": 1e-3}

    def eval_fn(e):
        return head(encoder(ids, mask, inputs_embeds=e))

    def run(smart_class, loss):
        embed = encoder.bert.embeddings.word_embeddings(ids)
        return smart_class(eval_fn, loss, **settings)(embed, eval_fn(embed))

    def ours():
        return run(SMARTLoss, sym_kl_loss)

    def theirs():
        return run(smart_pytorch.SMARTLoss, lambda p, c: smart_pytorch.sym_kl_loss(p, c, reduction="batchmean"))

    a = value_and_grads(ours, model, torch.zeros(1, requires_grad=True), 9)
    b = value_and_grads(theirs, model, torch.zeros(1, requires_grad=True), 9)
    assert_same(a, b)
    word_grad = dict(zip([n for n, _ in model.named_parameters()], a[1]))["encoder.bert.embeddings.word_embeddings.weight"]
    assert word_grad is not None and word_grad.abs().sum() > 0  # through the clean and perturbed embeddings


def test_binary_sym_kl_is_the_two_class_sym_kl():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(8, generator=g), torch.randn(8, generator=g)
    p1, p2 = torch.sigmoid(z1), torch.sigmoid(z2)
    kl = lambda p, q: p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()  # noqa: E731  KL(p || q), Bernoulli
    assert torch.allclose(binary_sym_kl_loss(z1, z2), (kl(p2, p1) + kl(p1, p2)).mean(), rtol=1e-5)


def test_bad_input():
    assert check_smart_weight(0) == 0.0 and check_smart_weight(0.5) == 0.5
    for bad in (-0.1, math.inf, math.nan, "1", True, None):
        with pytest.raises(UsageError, match="--smart-weight must be a finite number >= 0"):
            check_smart_weight(bad)
    with pytest.raises(UsageError, match="--smart-lambda must be"):
        check_smart_weight(-1, flag="--smart-lambda")
    with pytest.raises(UsageError, match="number of steps must be a whole number >= 0"):
        SMARTLoss(lambda e: e, sym_kl_loss, num_steps=-1)
    with pytest.raises(UsageError, match="step size must be a finite number >= 0"):
        SMARTLoss(lambda e: e, sym_kl_loss, step_size=math.nan)
