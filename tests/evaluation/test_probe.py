"""SentEval's PyTorch probe (bertcf.evaluation.probe) against a reference written from SentEval's
description, one probe at a time: nn.Linear built right after torch.manual_seed(1111), torch's own
Adam/RMSprop with the L2 strength as its weight_decay, numpy's generator seeded with 1111 drawing the
held-out rows and then one permutation a epoch, mean cross-entropy of each minibatch, early stopping
after every epoch_size epochs with SentEval's tenacity rule, and the three validations' loops over
scikit-learn's StratifiedKFold. The probe under test trains many probes side by side in one stacked
layer with the L2 term added by hand; both must give the same probes and the same scores.
(docs/bench/scripts/senteval_probe_comparison.py compares it with SentEval itself.)"""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.model_selection import StratifiedKFold

from bertcf.evaluation.probe import FASTTEST, SEED, TEST, Fit, linear_init, train_probes

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread

SMALL_TEST = replace(TEST, folds=3, batch_size=16, max_epoch=12)
SMALL_FAST = replace(FASTTEST, folds=3, batch_size=16, max_epoch=12)


def reference_fit(x, y, train, valid, l2, s, classes):
    """One probe, SentEval's way: (its nn.Linear at its best validation accuracy, that accuracy)."""
    rng = np.random.RandomState(s.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        model = torch.nn.Linear(x.shape[1], classes)
    optimizer = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop}[s.optim](model.parameters(), weight_decay=l2)
    if valid is None:
        order = rng.permutation(len(train))
        held = int(s.validation_split * len(train))
        train, valid = train[order[held:]], train[order[:held]]
    best, best_model, misses, epoch = -1.0, None, 0, 0
    while epoch <= s.max_epoch:
        for _ in range(s.epoch_size):
            order = rng.permutation(len(train))
            for i in range(0, len(train), s.batch_size):
                rows = torch.from_numpy(train[order[i:i + s.batch_size]])
                loss = F.cross_entropy(model(x[rows]), y[rows])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        epoch += s.epoch_size
        with torch.no_grad():
            accuracy = (model(x[valid]).argmax(1) == y[valid]).sum().item() / len(valid)
        if accuracy > best:
            best, best_model = accuracy, copy.deepcopy(model)
        elif misses >= s.tenacity:
            break
        else:
            misses += 1
    return best_model, best


def _data(n, dim=8, classes=2, seed=0, signal=0.5):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n)
    x = signal * rng.normal(size=(classes, dim))[y] + rng.normal(size=(n, dim))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def test_linear_init_is_nn_linear_after_the_seed_and_leaves_the_generator_alone():
    state = torch.random.get_rng_state()
    weight, bias = linear_init(5, 3, SEED)
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(SEED)
    layer = torch.nn.Linear(5, 3)
    assert torch.equal(weight, layer.weight) and torch.equal(bias, layer.bias)


@pytest.mark.parametrize("settings", [SMALL_TEST, SMALL_FAST], ids=["adam", "rmsprop"])
def test_probes_side_by_side_are_the_probes_trained_alone(settings):
    """Fits of different sizes (so different last minibatches and numbers of minibatches), given or
    held-out validation rows, every L2 strength, alone or with others on the same rows (which share
    one gather a step; with RMSprop, strengths 1.0 and 3.0 stop two epochs after the others of their
    rows): each probe and its validation accuracy as alone."""
    x, y = _data(150, classes=3, seed=1)
    rows = np.random.default_rng(2).permutation(150)
    fits = [Fit(rows[:70], rows[120:], 1e-5), Fit(rows[:69], rows[120:], 1e-2), Fit(rows[:64], rows[100:130], 1e-3),
            Fit(rows[:100], None, 1e-4), Fit(rows[:99], None, 1e-5), Fit(rows[:40], None, 1e-2),
            Fit(rows[:70], rows[120:], 0.1), Fit(rows[:70], rows[120:], 1.0), Fit(rows[:100], None, 3.0)]
    trained = train_probes(x, y, fits, settings, classes=3)
    accuracies = []
    for fit, probe in zip(fits, trained):
        model, best = reference_fit(x, y, fit.train, fit.valid, fit.l2, settings, 3)
        assert probe.valid_accuracy == best
        torch.testing.assert_close(probe.weight, model.weight.detach(), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(probe.bias, model.bias.detach(), atol=1e-5, rtol=1e-4)
        accuracies.append(best)
    assert len(set(accuracies)) > 1  # the probes differ: the comparison is not of six copies of one


def test_a_probe_trains_on_after_another_on_its_rows_stops():
    """Two probes on the same rows (one set, one gather a step): with tenacity 1, the weaker L2
    stops at epoch 8 while the stronger finds its best at epoch 10, which it only reaches if the set
    stays in the stack until its last probe stops."""
    settings = replace(SMALL_FAST, tenacity=1, max_epoch=40)
    x, y = _data(150, classes=3, seed=1)
    rows = np.random.default_rng(2).permutation(150)
    fits = [Fit(rows[:64], rows[100:130], 1e-5), Fit(rows[:64], rows[100:130], 1.0)]
    for fit, probe in zip(fits, train_probes(x, y, fits, settings, classes=3)):
        model, best = reference_fit(x, y, fit.train, fit.valid, fit.l2, settings, 3)
        assert probe.valid_accuracy == best
        torch.testing.assert_close(probe.weight, model.weight.detach(), atol=1e-5, rtol=1e-4)


def test_a_stack_of_one_is_the_same():
    """Training probes one at a time (stack=1) or together gives the same probes."""
    x, y = _data(120, seed=3)
    fits = [Fit(np.arange(80), np.arange(80, 120), l2) for l2 in (1e-5, 1e-2)] + [Fit(np.arange(100), None, 1e-3)]
    together = train_probes(x, y, fits, SMALL_TEST, classes=2)
    alone = train_probes(x, y, fits, replace(SMALL_TEST, stack=1), classes=2)
    for a, b in zip(together, alone):
        assert a.valid_accuracy == b.valid_accuracy
        torch.testing.assert_close(a.weight, b.weight, atol=1e-6, rtol=1e-5)


@pytest.mark.slow  # starts worker processes
@pytest.mark.parametrize("held_out", [True, False], ids=["two-sets", "one-set-split"])
def test_stacks_in_worker_processes_are_the_same(held_out):
    """Two sets in two processes, or (SST2's case) one set of four probes split between them."""
    x, y = _data(120, seed=3)
    fits = [Fit(np.arange(80), np.arange(80, 120), l2) for l2 in (1e-5, 1e-3, 1e-2)]
    fits += [Fit(np.arange(100), None, 1e-4)] if held_out else [Fit(np.arange(80), np.arange(80, 120), 1e-4)]
    here = train_probes(x, y, fits, SMALL_TEST, classes=2)
    there = train_probes(x, y, fits, replace(SMALL_TEST, jobs=2), classes=2)
    for a, b in zip(here, there):
        assert a.valid_accuracy == b.valid_accuracy
        # a set split in two multiplies by narrower weights: other kernels, other last bits on some CPUs
        torch.testing.assert_close(a.weight, b.weight, atol=1e-6, rtol=1e-5)


# ---- the three validations against SentEval's loops ----------------------------------------------
def _pick(scores):
    """SentEval: each strength's mean ×100 rounded to 2 decimals, the first best."""
    rounded = [round(100 * float(np.mean(s)), 2) for s in scores]
    return int(np.argmax(rounded)), max(rounded)


def _score(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).double().mean().item()


def reference_inner_kfold(x, y, s):
    folds = StratifiedKFold(n_splits=s.folds, shuffle=True, random_state=s.seed)
    dev, test = [], []
    for train, held in folds.split(x, y):
        scores = [[reference_fit(x, y, train[a], train[b], l2, s, 2)[1] for a, b in folds.split(x[train], y[train])]
                  for l2 in s.l2_grid]
        pick, best = _pick(scores)
        dev.append(best)
        model, _ = reference_fit(x, y, train, None, s.l2_grid[pick], s, 2)
        test.append(round(100 * _score(model, x[held], y[held]), 2))
    return round(float(np.mean(test)), 2), round(float(np.mean(dev)), 2)


def test_cross_validate_is_sentevals_inner_kfold():
    x, y = _data(150, seed=4, signal=0.8)
    ours = SMALL_TEST.cross_validate(x, y)
    accuracy, devacc = reference_inner_kfold(x, y, SMALL_TEST)
    assert (ours["accuracy"], ours["devacc"]) == (accuracy, devacc)
    assert 55 < accuracy < 95  # an imperfect probe on noisy data: not a comparison of two trivial figures


def test_train_test_is_sentevals_kfold_classifier():
    x, y = _data(160, classes=3, seed=5, signal=0.6)
    xt, yt = _data(60, classes=3, seed=5, signal=0.6)  # the same class means, other noise
    ours = SMALL_FAST.train_test(x, y, xt, yt)
    folds = list(StratifiedKFold(n_splits=3, shuffle=True, random_state=SEED).split(x, y))
    scores = [[reference_fit(x, y, a, b, l2, SMALL_FAST, 3)[1] for a, b in folds] for l2 in SMALL_FAST.l2_grid]
    pick, devacc = _pick(scores)
    model, _ = reference_fit(x, y, np.arange(len(y)), None, SMALL_FAST.l2_grid[pick], SMALL_FAST, 3)
    with torch.no_grad():
        predicted = model(xt).argmax(1).numpy()
    assert ours["devacc"] == devacc
    assert np.array_equal(ours["predicted"], predicted)
    assert ours["accuracy"] == round(100 * float((predicted == yt.numpy()).mean()), 2)


def test_split_is_sentevals_split_classifier():
    x, y = _data(200, seed=6, signal=0.4)
    ours = SMALL_TEST.split(x[:120], y[:120], x[120:160], y[120:160], x[160:], y[160:])
    runs = [reference_fit(x, y, np.arange(120), np.arange(120, 160), l2, SMALL_TEST, 2) for l2 in SMALL_TEST.l2_grid]
    pick, devacc = _pick([[best] for _, best in runs])
    # SentEval trains the chosen strength's probe again, the same way: the same probe
    again, _ = reference_fit(x, y, np.arange(120), np.arange(120, 160), SMALL_TEST.l2_grid[pick], SMALL_TEST, 2)
    assert ours == {"accuracy": round(100 * _score(again, x[160:], y[160:]), 2), "devacc": devacc}
