"""The multitask step's one update call (``StepMethods.backward``, issue 67) against references
computed here by hand on a tiny minBERT with the report's three heads: for the loss weightings
(fixed, uncertainty, DWA) the autograd gradients of the weighted sum written out (fixed: bit for
bit, the report's one backward); for an aggregator, torchjd's own ``mtl_backward`` and
``jac_to_grad``; SMART adds its term's gradient to either. The weights it returns are the ones
logged. Also the loop's side of the call (``training.optim.update``)."""
from __future__ import annotations

import pytest
import torch

from bertcf.models.encoder import SentenceEncoder
from bertcf.multitask.aggregation import build_aggregator, missing_modules
from bertcf.multitask.config import MultitaskConfig
from bertcf.multitask.methods import StepMethods
from bertcf.multitask.model import MultitaskModel
from bertcf.multitask.step import StepLosses, step_losses
from bertcf.multitask.tasks import builtin_tasks

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:You are solving a parameterized problem that is not DPP")]
SIZES = {"sst": 2, "qqp": 2, "sts": 2}
SENTENCES = ["a good film", "dull and long", "how do I cook rice", "what is a cat", "how is rice cooked",
             "where do cats live", "a man plays music", "kids sing", "a man is playing a guitar", "a dog runs"]


def model_and_batch(tiny_bert_dir):
    """A fresh tiny model (seeded: the same every call; the encoder's dropout off, the heads' on) and
    one step's inputs and labels."""
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0)
    model = MultitaskModel(encoder, list(builtin_tasks().values()), proj_dim=8)
    model.train()
    tokens = encoder.tokenize(SENTENCES)
    inputs = {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"], "sizes": dict(SIZES),
              "num_tokens": int(tokens["attention_mask"].sum())}
    labels = {"sst": model.heads["sst"].label_tensor([1, 4]), "qqp": model.heads["qqp"].label_tensor([1, 0]),
              "sts": model.heads["sts"].label_tensor([4.2, 0.5])}
    return model, inputs, labels


def config(**methods) -> MultitaskConfig:
    return MultitaskConfig(out_dir="unused", **methods)


def grads(model, extra=()) -> dict:
    params = dict(model.named_parameters()) | {f"extra.{i}": p for i, p in enumerate(extra)}
    return {n: p.grad.clone() for n, p in params.items() if p.grad is not None}


def update_call(tiny_bert_dir, scaler=None, prepare=None, **methods):
    """The call under test: ``step_losses`` then ``StepMethods.backward``; the gradients, the
    weights it returned, and the StepLosses."""
    model, inputs, labels = model_and_batch(tiny_bert_dir)
    step_methods = StepMethods(config(**methods), model)
    if prepare is not None:
        prepare(step_methods)
    torch.manual_seed(7)  # the heads' dropout draws, SMART's noise
    losses, _ = step_losses(model, step_methods, inputs, labels)
    logged = step_methods.backward(losses, scaler or torch.amp.GradScaler("cpu", enabled=False))
    return grads(model, step_methods.parameters()), logged, losses


def by_hand(tiny_bert_dir, weigh, prepare=None, **methods):
    """The reference: the forward written out, the task losses weighed by ``weigh(parts, methods)``
    (-> the list of weighted terms, in task order), and their python sum backpropagated."""
    model, inputs, labels = model_and_batch(tiny_bert_dir)
    step_methods = StepMethods(config(**methods), model)
    if prepare is not None:
        prepare(step_methods)
    torch.manual_seed(7)  # the heads' dropout draws
    out = model(**inputs)
    parts = {t: model.heads[t].loss(y, labels[t]) for t, y in out.items()}
    sum(weigh(parts, step_methods)).backward()
    return grads(model, step_methods.parameters())


def assert_same(got: dict, expected: dict, exact=False):
    assert got.keys() == expected.keys() and len(got) > 20
    scale = max(g.abs().max().item() for g in expected.values())  # noise: a key bias's gradient is 0 but for it
    for name, g in expected.items():
        if exact:
            assert torch.equal(got[name], g), name
        else:
            assert (got[name] - g).abs().max() <= 1e-5 * g.abs().max() + 1e-7 * scale, name  # to rounding


def test_fixed_weights_are_one_backward_of_the_weighted_sum_bit_for_bit(tiny_bert_dir):
    got, logged, losses = update_call(tiny_bert_dir)
    weights = {t: task.weight for t, task in builtin_tasks().items()}
    expected = by_hand(tiny_bert_dir, lambda parts, _: [weights[t] * parts[t] for t in parts])
    assert_same(got, expected, exact=True)
    assert logged == {f"weight_{t}": float(w) for t, w in weights.items()}
    assert isinstance(losses, StepLosses) and losses.smart is None


def set_log_var(step_methods):
    with torch.no_grad():
        step_methods.weighting.log_var.copy_(torch.tensor([0.3, -0.5, 0.8]))


def test_uncertainty_weighting(tiny_bert_dir):
    got, logged, _ = update_call(tiny_bert_dir, prepare=set_log_var, task_weighting="uncertainty")

    def kendall(parts, step_methods):  # exp(-s_t) L_t / 2 + s_t / 2
        s = step_methods.weighting.log_var
        return [0.5 * torch.exp(-s[i]) * parts[t] + 0.5 * s[i] for i, t in enumerate(parts)]
    assert_same(got, by_hand(tiny_bert_dir, kendall, prepare=set_log_var, task_weighting="uncertainty"))
    assert "extra.0" in got  # the log-variances learn
    factors = (0.5 * torch.exp(-torch.tensor([0.3, -0.5, 0.8]))).tolist()
    assert logged == pytest.approx({f"weight_{t}": f for t, f in zip(SIZES, factors)})


def two_periods(step_methods):
    """DWA with a window of one step and two steps' losses behind it: rates r_t = 2, 0.5, 1."""
    for losses in ({"sst": 1.0, "qqp": 2.0, "sts": 3.0}, {"sst": 2.0, "qqp": 1.0, "sts": 3.0}):
        step_methods.weighting({t: torch.tensor(v) for t, v in losses.items()})


def test_dynamic_weight_average(tiny_bert_dir):
    lambdas = 3 * torch.softmax(torch.tensor([2.0, 0.5, 1.0]) / 2.0, dim=0)  # K softmax(r / T), T = 2
    settings = {"task_weighting": "dwa", "dwa_window": 1}
    got, logged, _ = update_call(tiny_bert_dir, prepare=two_periods, **settings)
    expected = by_hand(tiny_bert_dir, lambda parts, _: [lambdas[i] * parts[t] for i, t in enumerate(parts)],
                       prepare=two_periods, **settings)
    assert_same(got, expected)
    assert logged == pytest.approx({f"weight_{t}": w for t, w in zip(SIZES, lambdas.tolist())})


def torchjd_reference(tiny_bert_dir, name, smart_weight=0.0):
    """torchjd's own two calls on the step's weighted losses (and SMART's term, backpropagated
    first as it is): the gradients and the weights ``jac_to_grad`` returned."""
    from torchjd.autojac import jac_to_grad, mtl_backward

    model, inputs, labels = model_and_batch(tiny_bert_dir)
    step_methods = StepMethods(config(smart_weight=smart_weight), model)
    torch.manual_seed(7)
    losses, _ = step_losses(model, step_methods, inputs, labels)
    if losses.smart is not None:
        losses.smart.backward(retain_graph=True)
    shared = [p for n, p in model.encoder.named_parameters() if not n.startswith("bert.pooler.")]
    torch.manual_seed(5)
    mtl_backward(list(losses.weighted.values()), features=losses.features, shared_params=shared,
                 parallel_chunk_size=1)
    weights = jac_to_grad(shared, build_aggregator(name, 3))
    return grads(model), weights


AGGREGATORS = ["mgda", "pcgrad", "upgrad"]


@pytest.mark.parametrize("name", AGGREGATORS)
def test_an_aggregator_is_torchjds_mtl_backward_and_jac_to_grad(tiny_bert_dir, name, monkeypatch):
    if missing_modules(name):
        pytest.skip(f"{name} needs {', '.join(missing_modules(name))}")
    import bertcf.multitask.aggregation as aggregation
    real = aggregation.mtl_backward

    def seeded(*args, **kwargs):  # pcgrad's random task order: drawn after the same seed as the reference's
        real(*args, **kwargs)
        torch.manual_seed(5)
    monkeypatch.setattr(aggregation, "mtl_backward", seeded)
    got, logged, _ = update_call(tiny_bert_dir, aggregator=name)
    expected, weights = torchjd_reference(tiny_bert_dir, name)
    assert_same(got, expected, exact=True)
    assert "encoder.bert.pooler.dense.weight" not in got
    assert logged == {**{f"weight_{t}": float(task.weight) for t, task in builtin_tasks().items()},
                      **{f"aggregator_weight_{t}": w for t, w in zip(SIZES, weights.tolist())}}
    if name in ("mgda", "upgrad"):  # its Gramian engine: the same update, to rounding
        gramian, logged_gramian, _ = update_call(tiny_bert_dir, aggregator=name, aggregator_gramian=True)
        assert_same(gramian, got)
        assert logged_gramian == pytest.approx(logged, rel=1e-4)


def smart_term_grads(tiny_bert_dir, **methods) -> dict:
    """The gradient of SMART's term alone (its weight times the regulariser), on the same draws."""
    model, inputs, labels = model_and_batch(tiny_bert_dir)
    step_methods = StepMethods(config(**methods), model)
    torch.manual_seed(7)
    losses, _ = step_losses(model, step_methods, inputs, labels)
    losses.smart.backward()
    return grads(model)


def added(a: dict, b: dict) -> dict:
    return {n: a.get(n, 0) + b.get(n, 0) for n in a.keys() | b.keys()}


def test_smart_adds_its_terms_gradient(tiny_bert_dir):
    got, logged, losses = update_call(tiny_bert_dir, smart_weight=1.0)
    weights = {t: task.weight for t, task in builtin_tasks().items()}
    plain = by_hand(tiny_bert_dir, lambda parts, _: [weights[t] * parts[t] for t in parts])
    assert_same(got, added(plain, smart_term_grads(tiny_bert_dir, smart_weight=1.0)))
    assert torch.equal(logged["smart"], losses.regulariser) and losses.regulariser > 0
    assert torch.equal(losses.smart, 1.0 * losses.regulariser) or torch.allclose(losses.smart, losses.regulariser)

    got, logged, _ = update_call(tiny_bert_dir, smart_weight=1.0, aggregator="mgda")
    expected, weights = torchjd_reference(tiny_bert_dir, "mgda", smart_weight=1.0)
    assert_same(got, expected)
    assert [logged[f"aggregator_weight_{t}"] for t in SIZES] == weights.tolist() and "smart" in logged


def test_grad_scaler_with_smart_and_an_aggregator(tiny_bert_dir):
    """fp16's GradScaler: SMART's scaled gradient already in .grad, the aggregator (FairGrad, which
    does not scale along with its input) fed the unscaled Jacobian: after ``unscale_`` the
    gradients of the unscaled step."""
    settings = {"smart_weight": 1.0, "aggregator": "fairgrad"}
    plain, _, _ = update_call(tiny_bert_dir, **settings)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    scaled, _, _ = update_call(tiny_bert_dir, scaler=scaler, **settings)
    assert_same({n: g / 2.0 ** 10 for n, g in scaled.items()}, plain)


def test_the_loop_logs_what_the_update_call_returns():
    from bertcf.training.optim import plain_backward, update

    w = torch.nn.Parameter(torch.tensor([2.0]))
    optimizer = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    loss, scalars = update(optimizer, scaler, lambda: ((w * 3).sum(), {"a": 1.0}), "cpu", "fp32")
    assert scalars == {"a": 1.0} and torch.equal(w.detach(), torch.tensor([1.7])) and float(loss.detach()) == 6.0
    assert update.__defaults__[-1] is plain_backward
    seen = []

    def backward(losses, scaler):
        seen.append(losses)
        losses.total.backward()
        return {"weight_x": 0.5}
    losses = StepLosses(total=(w * 2).sum(), weighted={}, features=w)
    loss, scalars = update(optimizer, scaler, lambda: (losses, {"a": 1.0}), "cpu", "fp32", backward=backward)
    assert seen == [losses] and loss is losses.total and scalars == {"a": 1.0, "weight_x": 0.5}
