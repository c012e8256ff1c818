"""Gradient aggregation (bertcf.multitask.aggregation) against independent references: each
task's gradient computed on its own with ``torch.autograd.grad`` and the torchjd aggregator
applied directly to the matrix of them; PCGrad also against the paper's algorithm written out
here (Yu et al. 2020, "Gradient Surgery for Multi-Task Learning", Algorithm 1); ``sum`` against
the plain backward of the summed losses, bit for bit, and the sum of the tasks' own gradients."""
import pytest
import torch
import torch.nn as nn

from bertcf.errors import UsageError
from bertcf.models.encoder import SentenceEncoder
from bertcf.multitask import aggregation
from bertcf.multitask.aggregation import (AGGREGATORS, STATEFUL, aggregated_backward, aggregator_state,
                                          build_aggregator, check_aggregator, load_aggregator_state,
                                          missing_modules)

NUM_TASKS = 3
OFFERED = [name for name in AGGREGATORS if name != "sum"]
pytestmark = pytest.mark.filterwarnings("ignore:You are solving a parameterized problem that is not DPP")


def needs_solvers(name):
    missing = missing_modules(name)
    if missing:
        pytest.skip(f"{name} needs {', '.join(missing)} (pip install -e '.[mtl-solvers]')")


class Toy(nn.Module):
    """A shared MLP trunk, an unused shared layer (like minBERT's pooler in bi-encoding) and three
    task heads of different shapes, in float64 so that the references agree to rounding."""

    def __init__(self, seed=0, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8))
        self.unused = nn.Linear(8, 8)
        self.heads = nn.ModuleList([nn.Linear(8, 4), nn.Linear(8, 1), nn.Linear(8, 3)])
        self.to(dtype)

    def losses(self, x, targets):
        """features [n, 8] and the three tasks' losses (cross-entropy, squared error, and a third
        whose targets pull against the second's so that the gradients conflict)."""
        f = self.trunk(x)
        return f, [nn.functional.cross_entropy(self.heads[0](f), targets[0]),
                   (self.heads[1](f).squeeze(1) - targets[1]).square().mean() * 3.0,
                   (self.heads[2](f) - targets[2]).square().mean()]


def toy_batch(seed=1, dtype=torch.float64, n=12):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=dtype)
    return x, (torch.randint(0, 4, (n,), generator=g), torch.randn(n, generator=g, dtype=dtype),
               torch.randn(n, 3, generator=g, dtype=dtype) * 2)


def task_gradients(losses, shared, heads):
    """The reference: each task's gradient on the shared parameters (a row of J [m, n]) and on its
    head, each from its own torch.autograd.grad."""
    rows, head_grads = [], []
    for loss, head in zip(losses, heads):
        grads = torch.autograd.grad(loss, shared, retain_graph=True)
        rows.append(torch.cat([g.flatten() for g in grads]))
        head_grads.append(torch.autograd.grad(loss, list(head.parameters()), retain_graph=True))
    return torch.stack(rows), head_grads


def flat_grad(params):
    return torch.cat([p.grad.flatten() for p in params])


@pytest.mark.parametrize("name", OFFERED)
def test_shared_gradient_is_the_aggregation_and_heads_get_their_own(name):
    needs_solvers(name)
    model = Toy()
    shared = list(model.trunk.parameters()) + list(model.unused.parameters())
    trunk = list(model.trunk.parameters())
    f, losses = model.losses(*toy_batch())
    jacobian, head_grads = task_gradients(losses, trunk, model.heads)
    cosines = nn.functional.normalize(jacobian, dim=1) @ nn.functional.normalize(jacobian, dim=1).T
    assert (cosines < -0.05).any()  # conflicting tasks: the aggregators differ from a sum
    torch.manual_seed(5)  # the random ones (graddrop, random, pcgrad's and gradvac's orders) draw alike
    expected = build_aggregator(name, NUM_TASKS)(jacobian)
    torch.manual_seed(5)
    weights = aggregated_backward(losses, f, shared, build_aggregator(name, NUM_TASKS))
    got = flat_grad(trunk)
    assert torch.allclose(got, expected, rtol=1e-7, atol=1e-9 * expected.abs().max().item()), name
    assert not torch.allclose(got, jacobian.sum(0), rtol=1e-3)
    for head, grads in zip(model.heads, head_grads):
        for p, g in zip(head.parameters(), grads):
            assert torch.equal(p.grad, g) or torch.allclose(p.grad, g, rtol=1e-12, atol=1e-14)
    assert model.unused.weight.grad is None  # not in the features' graph: left alone, as backward leaves it
    if weights is not None:  # a weighted aggregator's weights give the update
        assert torch.allclose(weights @ jacobian, got, rtol=1e-6, atol=1e-9)


def pcgrad_as_in_the_paper(jacobian):
    """Yu et al. 2020, Algorithm 1: for each task i, g_i^PC = g_i; for each other task j, in random
    order, if g_i^PC . g_j < 0, g_i^PC -= (g_i^PC . g_j) / |g_j|^2 g_j; the update is the sum of
    the g_i^PC. The random order is what torchjd documents ("as defined in Algorithm 1") and does:
    for each i in turn, one torch.randperm over all m tasks, i itself skipped; drawn the same way
    here, the same seed gives the same orders."""
    m = jacobian.shape[0]
    update = torch.zeros_like(jacobian[0])
    for i in range(m):
        g = jacobian[i].clone()
        for j in torch.randperm(m).tolist():
            if j == i:
                continue
            dot = g @ jacobian[j]
            if dot < 0:
                g = g - dot / (jacobian[j] @ jacobian[j]) * jacobian[j]
        update += g
    return update


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pcgrad_follows_the_paper(seed):
    model = Toy(seed)
    trunk = list(model.trunk.parameters())
    f, losses = model.losses(*toy_batch(seed + 10))
    jacobian, _ = task_gradients(losses, trunk, model.heads)
    assert ((jacobian @ jacobian.T) < 0).any()  # something to project
    torch.manual_seed(seed)
    expected = pcgrad_as_in_the_paper(jacobian)
    torch.manual_seed(seed)
    aggregated_backward(losses, f, trunk, build_aggregator("pcgrad"))
    assert torch.allclose(flat_grad(trunk), expected, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(expected, jacobian.sum(0), rtol=1e-3)


def test_sum_is_todays_backward_bit_for_bit():
    """``sum`` is plain training: the step's loss sum(w_t L_t) (the weighting's python sum) and its
    backward, on every parameter, bit for bit, with no weights to log. That backward is, to rounding,
    what the other aggregators start from: the shared layers get the sum of each task's gradient on
    its own (``task_gradients``, the row sum of the Jacobian), each head its own task's alone."""
    weights = (5.0, 20.0, 1.0)  # the report's, SST, QQP, STS
    check_aggregator("sum", num_tasks=1, world_size=4)  # fine anywhere
    grads = []
    for use_aggregation in (False, True):
        model = Toy(dtype=torch.float32)
        f, losses = model.losses(*toy_batch(dtype=torch.float32))
        weighted = [w * loss for w, loss in zip(weights, losses)]
        if use_aggregation:
            assert aggregated_backward(weighted, f, model.trunk.parameters(), build_aggregator("sum")) is None
        else:
            sum(weighted).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 10  # the unused layer has none
    for name, g in grads[0].items():
        assert torch.equal(grads[1][name], g), name

    model = Toy()  # float64: the two ways agree to rounding
    trunk = list(model.trunk.parameters())
    f, losses = model.losses(*toy_batch())
    weighted = [w * loss for w, loss in zip(weights, losses)]
    jacobian, head_grads = task_gradients(weighted, trunk, model.heads)
    aggregated_backward(weighted, f, trunk, build_aggregator("sum"))
    assert torch.allclose(flat_grad(trunk), jacobian.sum(0), rtol=1e-12, atol=1e-14)
    for head, own in zip(model.heads, head_grads):
        for p, g in zip(head.parameters(), own):
            assert torch.allclose(p.grad, g, rtol=1e-12, atol=1e-14)
    assert model.unused.weight.grad is None


def test_tiny_minbert_encoder_with_three_heads(tiny_bert_dir):
    """The real case: the encoder's sentence vectors [n, D] (float32, as pooling returns them) are
    the features, from a padded batch run unpadded; BERT's pooler, which the sentence vectors do not use, gets no gradient."""
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    heads = nn.ModuleList([nn.Linear(encoder.output_dim, k) for k in (5, 3, 3)])
    tokens = encoder.tokenize(["a first sentence", "two", "the third one is longer than the others",
                               "four more words here", "five", "six six"])
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    assert (mask == 0).any()

    def forward():
        u = encoder(ids, mask)
        rows = u.split(2)
        return u, [nn.functional.cross_entropy(heads[0](rows[0]), torch.tensor([1, 4])),
                   (heads[1](rows[1]) - 1).square().mean(),
                   (heads[2](rows[2]) + rows[1].detach()[:, :3]).square().mean()]

    used = [p for n, p in encoder.named_parameters() if not n.startswith("bert.pooler.")]
    jacobian, head_grads = task_gradients(forward()[1], used, heads)
    for name in ("mgda", "pcgrad"):
        encoder.zero_grad(set_to_none=True)
        heads.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        expected = build_aggregator(name)(jacobian)
        torch.manual_seed(3)
        u, losses = forward()
        aggregated_backward(losses, u, encoder.parameters(), build_aggregator(name))
        got = flat_grad(used)
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6 * expected.abs().max().item()), name
        assert not torch.allclose(got, jacobian.sum(0), rtol=1e-3)
        assert encoder.bert.pooler.dense.weight.grad is None
        for head, grads in zip(heads, head_grads):
            for p, g in zip(head.parameters(), grads):
                assert torch.allclose(p.grad, g, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["pcgrad", "mgda", "upgrad"])
def test_bf16_autocast(name):
    """Under bf16 autocast the Jacobian is float32 (the parameters' dtype) and the result is the
    aggregation of the autocast graph's own per-task gradients."""
    needs_solvers(name)
    model = Toy(dtype=torch.float32)
    trunk = list(model.trunk.parameters())
    x, targets = toy_batch(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f, losses = model.losses(x, targets)
    assert f.dtype == torch.bfloat16
    jacobian, head_grads = task_gradients(losses, trunk, model.heads)
    torch.manual_seed(0)
    expected = build_aggregator(name)(jacobian)
    torch.manual_seed(0)
    aggregated_backward(losses, f, trunk, build_aggregator(name))
    assert all(p.grad.dtype == torch.float32 for p in trunk)
    assert torch.allclose(flat_grad(trunk), expected, rtol=1e-5, atol=1e-6 * expected.abs().max().item())
    for head, grads in zip(model.heads, head_grads):
        for p, g in zip(head.parameters(), grads):
            assert torch.allclose(p.grad, g, rtol=1e-6, atol=1e-7)


def test_grad_scaler_scaled_losses():
    """fp16's GradScaler: scaled losses with ``loss_scale`` give, after ``unscale_``, the update of the
    unscaled losses, also for an aggregator that does not scale along with its input (FairGrad),
    which without ``loss_scale`` would not."""
    results = {}
    for case in ("plain", "scaled", "scaled-unsaid"):
        model = Toy(dtype=torch.float32)
        trunk = list(model.trunk.parameters())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
        f, losses = model.losses(*toy_batch(dtype=torch.float32))
        if case == "plain":
            aggregated_backward(losses, f, trunk, build_aggregator("fairgrad"))
        else:
            scale = scaler.get_scale() if case == "scaled" else None
            aggregated_backward([scaler.scale(loss) for loss in losses], f, trunk, build_aggregator("fairgrad"),
                                loss_scale=scale)
            scaler.unscale_(optimizer)
        results[case] = flat_grad(trunk)
    assert torch.allclose(results["scaled"], results["plain"], rtol=1e-4, atol=1e-6)
    assert not torch.allclose(results["scaled-unsaid"], results["plain"], rtol=1e-2)


def test_non_finite_jacobian_is_not_aggregated_and_the_scaler_skips_the_step():
    calls = []

    class Counted(aggregation.tja.Mean):
        def forward(self, matrix, /):
            calls.append(matrix)
            return super().forward(matrix)

    model = Toy(dtype=torch.float32)
    trunk = list(model.trunk.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    f, losses = model.losses(*toy_batch(dtype=torch.float32))
    losses[1] = losses[1] * torch.tensor(float("inf"))  # an fp16 overflow
    aggregated_backward([scaler.scale(loss) for loss in losses], f, trunk, Counted(), loss_scale=scaler.get_scale())
    assert not calls
    assert not torch.isfinite(flat_grad(trunk)).all()
    scaler.step(optimizer)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scaler.get_scale() < 2.0 ** 12


@pytest.mark.parametrize("name", [n for n in STATEFUL])
def test_stateful_aggregator_resumes_exactly(name):
    needs_solvers(name)

    def step(aggregator, seed):
        model = Toy()
        trunk = list(model.trunk.parameters())
        f, losses = model.losses(*toy_batch(seed))
        torch.manual_seed(seed)
        aggregated_backward(losses, f, trunk, aggregator)
        return flat_grad(trunk)

    aggregator = build_aggregator(name, NUM_TASKS)
    for seed in (1, 2, 3):
        step(aggregator, seed)
    state = aggregator_state(aggregator)
    assert isinstance(state, bytes)
    expected = step(aggregator, 4)
    resumed = build_aggregator(name, NUM_TASKS)
    load_aggregator_state(resumed, state)
    assert torch.equal(step(resumed, 4), expected)
    assert not torch.equal(step(build_aggregator(name, NUM_TASKS), 4), expected)  # the state matters
    assert aggregator_state(build_aggregator("pcgrad")) is None
    with pytest.raises(ValueError, match="not"):
        load_aggregator_state(build_aggregator("mean"), state)


def test_every_torchjd_aggregator_is_offered_or_left_out_on_purpose():
    offered = set()
    for name in OFFERED:
        if not missing_modules(name):
            offered.add(type(build_aggregator(name, NUM_TASKS)).__name__)
    left_out = {"Krum", "TrimmedMean", "Constant", "Sum"}  # the module's docstring says why
    classes = {c for c in dir(aggregation.tja) if isinstance(getattr(aggregation.tja, c), type)
               and issubclass(getattr(aggregation.tja, c), aggregation.tja.Aggregator)
               and c not in ("Aggregator", "WeightedAggregator", "GramianWeightedAggregator")}
    needing_extras = {"UPGrad", "DualProj", "CAGrad", "NashMTL"}
    assert classes - left_out - offered <= needing_extras
    assert not offered & left_out


def test_bad_input():
    with pytest.raises(UsageError, match="unknown aggregator 'pc-grad'; choose one of: sum, mean, upgrad"):
        build_aggregator("pc-grad")
    with pytest.raises(UsageError, match="unknown aggregator"):
        check_aggregator("nope", num_tasks=3)
    with pytest.raises(UsageError, match="--aggregator pcgrad needs at least two tasks"):
        check_aggregator("pcgrad", num_tasks=1)
    with pytest.raises(UsageError, match="cannot train on 2 processes"):
        check_aggregator("mgda", num_tasks=3, world_size=2)
    check_aggregator("mgda", num_tasks=2)
    from bertcf.multitask.config import MultitaskConfig  # the setting's choices are the registry's
    with pytest.raises(UsageError, match="aggregator must be one of sum, mean, upgrad, .*, pcd, not 'pc-grad'"):
        MultitaskConfig(aggregator="pc-grad", out_dir="unused")
    check_aggregator("sum", num_tasks=1)
    with pytest.raises(ValueError, match="at least two losses"):
        model = Toy()
        f, losses = model.losses(*toy_batch())
        aggregated_backward(losses[:1], f, model.trunk.parameters(), build_aggregator("mgda"))


def test_the_gramian_engine_only_for_gramian_based_aggregators():
    """``--aggregator-gramian``: the aggregators of ``GRAMIAN_BASED`` are torchjd's
    GramianWeightedAggregators, whose weights jac_to_grad can take from the Gramian; the others are
    refused in one line. On the toy, the same update as from the whole Jacobian, to rounding."""
    for name in OFFERED:
        if not missing_modules(name):
            gramian = isinstance(build_aggregator(name, NUM_TASKS), aggregation.tja.GramianWeightedAggregator)
            assert gramian == (name in aggregation.GRAMIAN_BASED), name
    with pytest.raises(UsageError, match="--aggregator-gramian needs an aggregator whose weights come from the "
                                         "Gramian .*, not mean"):
        check_aggregator("mean", num_tasks=3, gramian=True)
    with pytest.raises(UsageError, match="not sum"):
        check_aggregator("sum", num_tasks=3, gramian=True)
    check_aggregator("pcgrad", num_tasks=3, gramian=True)
    got = []
    for gramian in (False, True):
        model = Toy(dtype=torch.float32)
        trunk = list(model.trunk.parameters())
        f, losses = model.losses(*toy_batch(dtype=torch.float32))
        weights = aggregated_backward(losses, f, trunk, build_aggregator("mgda"), gramian=gramian)
        got.append((flat_grad(trunk), weights))
    assert torch.allclose(got[0][0], got[1][0], rtol=1e-4, atol=1e-6) and torch.allclose(got[0][1], got[1][1])


def test_a_missing_solver_is_one_line(monkeypatch):
    monkeypatch.setitem(aggregation.NEEDS, "upgrad", ("no_such_solver_module",))
    with pytest.raises(UsageError) as error:
        check_aggregator("upgrad", num_tasks=3)
    assert str(error.value) == "aggregator upgrad needs no_such_solver_module: pip install -e '.[mtl-solvers]'"
    with pytest.raises(UsageError, match="needs no_such_solver_module"):
        build_aggregator("upgrad")


def test_learned_loss_weights_and_a_frozen_trunk():
    """Uncertainty weighting's log-variances are each task's own parameters (found in the losses'
    graphs): under aggregation they get the gradient of the weighted total, as under backward.
    With the trunk frozen there is nothing to aggregate: the plain backward of the sum."""
    from bertcf.multitask.weighting import UncertaintyWeighting

    model = Toy(dtype=torch.float32)
    weighting = UncertaintyWeighting(["a", "b", "c"])
    with torch.no_grad():
        weighting.log_var.copy_(torch.tensor([0.2, -0.4, 0.1]))
    f, losses = model.losses(*toy_batch(dtype=torch.float32))
    total, weighted = weighting(dict(zip("abc", losses)))
    expected = torch.autograd.grad(total, weighting.log_var, retain_graph=True)[0]
    aggregated_backward(list(weighted.values()), f, model.trunk.parameters(), build_aggregator("upgrad"
                        if not missing_modules("upgrad") else "mgda"))
    assert torch.allclose(weighting.log_var.grad, expected, rtol=1e-6)

    model = Toy(dtype=torch.float32)
    model.trunk.requires_grad_(False)
    f, losses = model.losses(*toy_batch(dtype=torch.float32))
    expected = [torch.autograd.grad(loss, list(head.parameters()), retain_graph=True)
                for loss, head in zip(losses, model.heads)]
    assert aggregated_backward(losses, f, model.trunk.parameters(), build_aggregator("pcgrad")) is None
    for head, grads in zip(model.heads, expected):
        assert all(torch.allclose(p.grad, g) for p, g in zip(head.parameters(), grads))
    assert all(p.grad is None for p in model.trunk.parameters())
