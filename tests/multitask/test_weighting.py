"""Loss weightings (bertcf.multitask.weighting) against independent implementations: torchjd's
scalarizers ``UW`` and ``DWA`` (torchjd is a dependency), LibMTL's weightings ``UW`` and ``DWA``
where LibMTL is installed (``pip install --no-deps LibMTL==1.1.5``, as .ci/run does; it is in no
extra, as its own dependencies would replace this project's torch), and the papers' formulas written out here:
Kendall, Gal & Cipolla 2018 (uncertainty weighting, LibMTL's form sum_t exp(-s_t) L_t / 2 +
s_t / 2) and Liu, Johns & Davison 2019 (DWA). The fixed weighting is today's sum, bit for bit."""
import copy
import importlib
import importlib.util
import math
import sys
import types

import pytest
import torch

from bertcf.errors import UsageError
from bertcf.multitask.weighting import (DynamicWeightAverage, FixedWeighting, UncertaintyWeighting,
                                        build_weighting)

TASKS = ("sst", "qqp", "sts")


def loss_stream(steps, seed=0, drift=(0.9, 0.99, 1.02)):
    """Per-step task losses whose averages move at different rates, as leaf tensors [3]."""
    g = torch.Generator().manual_seed(seed)
    for i in range(steps):
        base = torch.tensor([d ** i for d in drift])
        yield (base * (1 + 0.2 * torch.rand(3, generator=g))).requires_grad_()


def as_dict(values):
    return dict(zip(TASKS, values.unbind()))


@pytest.fixture
def libmtl(monkeypatch):
    """LibMTL's weighting modules. Its package __init__ imports its ResNet models, which need
    torchvision's ``models.utils`` (gone since torchvision 0.13), so they are loaded under a bare
    package object instead: they need only torch and numpy."""
    spec = importlib.util.find_spec("LibMTL")
    if spec is None:
        pytest.skip("LibMTL is not installed (pip install --no-deps LibMTL==1.1.5)")
    for name, path in (("LibMTL", spec.submodule_search_locations),
                       ("LibMTL.weighting", [p + "/weighting" for p in spec.submodule_search_locations])):
        package = types.ModuleType(name)
        package.__path__ = list(path)
        monkeypatch.setitem(sys.modules, name, package)
    for name in ("LibMTL.weighting.abstract_weighting", "LibMTL.weighting.UW", "LibMTL.weighting.DWA"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return types.SimpleNamespace(UW=importlib.import_module("LibMTL.weighting.UW").UW,
                                 DWA=importlib.import_module("LibMTL.weighting.DWA").DWA)


# ---- fixed ---------------------------------------------------------------------------------------
def test_fixed_is_todays_sum_bit_for_bit():
    weights = {"sst": 5.0, "qqp": 20.0, "sts": 1.0}
    weighting = build_weighting("fixed", TASKS, weights)
    for values in loss_stream(5):
        parts = as_dict(values)
        total, weighted = weighting(parts)
        assert torch.equal(total, sum(weights[t] * parts[t] for t in parts))
        assert all(torch.equal(weighted[t], weights[t] * parts[t]) for t in parts)
    assert weighting.weights() == weights
    assert not list(weighting.parameters()) and not weighting.state_dict()
    total, weighted = weighting({"qqp": parts["qqp"]})  # a step with one task
    assert torch.equal(total, 20.0 * parts["qqp"]) and list(weighted) == ["qqp"]


# ---- uncertainty ---------------------------------------------------------------------------------
def uncertainty_formula(log_var, losses):
    return sum(math.exp(-s) * loss / 2 + s / 2 for s, loss in zip(log_var, losses))


def test_uncertainty_matches_torchjd_and_the_formula():
    from torchjd.scalarization import UW

    ours, theirs = UncertaintyWeighting(TASKS), UW(3)
    assert torch.equal(ours.log_var, theirs.log_var)  # both start at sigma^2 = 1
    with torch.no_grad():
        ours.log_var.copy_(torch.tensor([0.3, -1.2, 0.7]))
        theirs.log_var.copy_(ours.log_var)
    for values in loss_stream(4):
        total, weighted = ours(as_dict(values))
        assert torch.allclose(total, sum(weighted.values()), rtol=0, atol=0)
        expected = theirs(values)
        assert torch.allclose(total, expected, rtol=1e-6)
        assert math.isclose(total.item(), uncertainty_formula(ours.log_var.tolist(), values.tolist()), rel_tol=1e-6)
        ours_grads = torch.autograd.grad(total, [values, ours.log_var])
        theirs_grads = torch.autograd.grad(expected, [values, theirs.log_var])
        for a, b in zip(ours_grads, theirs_grads):
            assert torch.allclose(a, b, rtol=1e-6)
    factors = ours.weights()
    assert list(factors) == list(TASKS)
    assert math.isclose(factors["qqp"], math.exp(1.2) / 2, rel_tol=1e-6)


def test_uncertainty_matches_libmtl(libmtl):
    """LibMTL's UW starts at s = -0.5 and returns the factors exp(-s) / 2 it used."""
    ours = build_weighting("uncertainty", TASKS, log_var_init=-0.5)
    theirs = libmtl.UW()
    theirs.task_num, theirs.device = 3, torch.device("cpu")
    theirs.init_param()
    assert torch.equal(ours.log_var.detach(), theirs.loss_scale.detach())
    for values in loss_stream(3):
        total, _ = ours(as_dict(values))
        ours_grads = torch.autograd.grad(total, [values, ours.log_var])
        values.grad = None
        factors = theirs.backward(values)  # LibMTL backpropagates its total itself
        assert torch.allclose(ours_grads[0], values.grad, rtol=1e-6)
        assert torch.allclose(ours_grads[1], theirs.loss_scale.grad, rtol=1e-6)
        theirs.loss_scale.grad = None
        assert torch.allclose(torch.tensor(list(ours.weights().values())), torch.from_numpy(factors), rtol=1e-6)


def test_uncertainty_log_variances_train_and_resume():
    weighting = build_weighting("uncertainty", TASKS)
    optimizer = torch.optim.SGD(weighting.parameters(), lr=0.1)
    streams = list(loss_stream(6))
    for values in streams[:3]:
        optimizer.zero_grad()
        weighting(as_dict(values.detach()))[0].backward()
        optimizer.step()
    assert not torch.equal(weighting.log_var.detach(), torch.zeros(3))  # the optimizer moved them
    state = copy.deepcopy(weighting.state_dict())
    resumed = build_weighting("uncertainty", TASKS)
    resumed.load_state_dict(state)
    for values in streams[3:]:
        assert torch.equal(weighting(as_dict(values))[0], resumed(as_dict(values))[0])


# ---- DWA -----------------------------------------------------------------------------------------
def dwa_formula(averages, temperature=2.0):
    """The paper's weights from the finished periods' average losses ([K] each, oldest first):
    1 for all tasks before two periods, then K exp(r_t / T) / sum_k exp(r_k / T) with
    r_t = Lbar_t(p - 1) / Lbar_t(p - 2)."""
    k = len(averages[0]) if averages else 3
    if len(averages) < 2:
        return [1.0] * k
    rates = [new / old for new, old in zip(averages[-1], averages[-2])]
    exps = [math.exp(r / temperature) for r in rates]
    return [k * e / sum(exps) for e in exps]


@pytest.mark.parametrize("window", [1, 3])
def test_dwa_matches_torchjd_and_the_formula(window):
    from torchjd.scalarization import DWA

    ours, theirs = build_weighting("dwa", TASKS, window=window), DWA(temperature=2.0)
    averages, period = [], []
    seen_unequal = False
    for step, values in enumerate(loss_stream(7 * window)):
        expected_weights = dwa_formula(averages)
        assert list(ours.weights().values()) == pytest.approx(expected_weights, rel=1e-6)
        seen_unequal |= max(expected_weights) - min(expected_weights) > 1e-3
        total, weighted = ours(as_dict(values))
        assert torch.equal(total, theirs(values))  # the same float32 operations
        assert torch.allclose(total, values.detach() @ torch.tensor(expected_weights), rtol=1e-6)
        period.append(values.detach().tolist())
        if (step + 1) % window == 0:
            theirs.step()
            averages.append([sum(column) / window for column in zip(*period)])
            period = []
    assert seen_unequal


def test_dwa_matches_libmtl(libmtl):
    """LibMTL's DWA reads the epochs' average losses from its train_loss_buffer [K, epochs] and the
    epoch number; fed our periods' averages, it gives our weights."""
    import numpy as np

    window = 2
    ours, theirs = build_weighting("dwa", TASKS, window=window), libmtl.DWA()
    theirs.task_num, theirs.device = 3, torch.device("cpu")
    buffer, period = [], []
    for step, values in enumerate(loss_stream(6 * window)):
        theirs.epoch, theirs.train_loss_buffer = step // window, np.array(buffer).T
        libmtl_weights = theirs.backward(values.clone().detach().requires_grad_(), T=2.0)
        assert np.allclose(list(ours.weights().values()), libmtl_weights, rtol=1e-6)
        ours(as_dict(values))
        period.append(values.detach().numpy())
        if len(period) == window:
            buffer.append(np.mean(period, axis=0))
            period = []


def test_dwa_missing_task_keeps_its_average():
    ours = DynamicWeightAverage(TASKS, window=2)
    steps = [{"sst": 2.0, "qqp": 4.0, "sts": 1.0}, {"sst": 2.0, "qqp": 4.0},
             {"sst": 1.0, "qqp": 4.0}, {"sst": 1.0, "qqp": 2.0}]
    for parts in steps:
        ours({t: torch.tensor(v) for t, v in parts.items()})
    # averages: period 1 (2, 4, 1), period 2 (1, 3, 1 kept): rates 0.5, 0.75, 1
    assert list(ours.weights().values()) == pytest.approx(dwa_formula([[2, 4, 1], [1, 3, 1]]), rel=1e-6)


def test_dwa_resumes_bit_identically_mid_period():
    stream = list(loss_stream(20, seed=3))
    weighting = build_weighting("dwa", TASKS, window=3, temperature=1.5)
    for values in stream[:10]:  # 3 periods and one step of the fourth
        weighting(as_dict(values))
    state = copy.deepcopy(weighting.state_dict())
    resumed = build_weighting("dwa", TASKS, window=3, temperature=1.5)
    fresh = build_weighting("dwa", TASKS, window=3, temperature=1.5)
    resumed.load_state_dict(state)
    differs = False
    for values in stream[10:]:
        expected = weighting(as_dict(values))[0]
        assert torch.equal(resumed(as_dict(values))[0], expected)
        differs |= not torch.equal(fresh(as_dict(values))[0], expected)
    assert differs  # the state is what carried the history


# ---- bad input -----------------------------------------------------------------------------------
def test_bad_input():
    with pytest.raises(UsageError, match="unknown loss weighting 'gradnorm'; choose one of: fixed, uncertainty, dwa"):
        build_weighting("gradnorm", TASKS)
    from bertcf.multitask.config import MultitaskConfig  # the setting's choices are the registry's
    with pytest.raises(UsageError, match="task_weighting must be one of fixed, uncertainty, dwa, not 'gradnorm'"):
        MultitaskConfig(task_weighting="gradnorm", out_dir="unused")
    with pytest.raises(UsageError, match="fixed needs a weight for task sts"):
        build_weighting("fixed", TASKS, {"sst": 1, "qqp": 1})
    for bad in (-1.0, math.inf, math.nan, "2"):
        with pytest.raises(UsageError, match="the weight of task qqp must be a finite number >= 0"):
            build_weighting("fixed", TASKS, {"sst": 1, "qqp": bad, "sts": 1})
    with pytest.raises(UsageError, match=r"loss weighting dwa has no setting 'log_var_init' \(its settings: temperature, window\)"):
        build_weighting("dwa", TASKS, log_var_init=0.0)
    with pytest.raises(UsageError, match="has no setting 'window'"):
        build_weighting("uncertainty", TASKS, window=3)
    for temperature in (0.0, -1.0, math.inf):
        with pytest.raises(UsageError, match="temperature must be a finite number > 0"):
            build_weighting("dwa", TASKS, temperature=temperature)
    for window in (0, 2.5, True):
        with pytest.raises(UsageError, match="window must be a whole number of steps >= 1"):
            build_weighting("dwa", TASKS, window=window)
    with pytest.raises(UsageError, match="log_var_init must be a finite number"):
        build_weighting("uncertainty", TASKS, log_var_init=math.nan)
    with pytest.raises(ValueError, match="does not know"):
        FixedWeighting({"sst": 1.0})({"mnli": torch.tensor(1.0)})
