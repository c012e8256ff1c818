"""SentEval's PyTorch probe (``usepytorch=True``): a linear classifier on frozen sentence vectors,
trained by Adam or RMSprop with early stopping, its L2 strength chosen by a validation.

This is the probe behind the transfer figures of SentEval's paper (Conneau & Kiela 2018), SimCSE's
evaluation script and the papers that use "the SentEval toolkit" as it comes. Written from its
description and its README's settings, it reproduces SentEval's procedure step for step:

* the probe: ``nn.Linear(D, classes)`` (SentEval's ``nhid=0``), initialised right after
  ``torch.manual_seed(1111)``, trained on the mean cross-entropy of minibatches, with the L2
  strength as the optimiser's weight decay (added to the gradient, biases included), at the
  optimiser's default learning rate (Adam 1e-3, RMSprop 1e-2);
* the data order: every probe seeds numpy's generator with 1111, then draws one permutation of its
  rows per epoch (after one more, first, when it holds out its own validation rows: the first 5% of
  that permutation, rounded down, are held out and the rest train, in that order; at least one row,
  where SentEval's 5% of fewer than 20 rows would be none and stop it with an error);
* early stopping: after every ``epoch_size`` epochs the probe is scored on its validation rows; a
  better accuracy keeps a copy of the probe, and the ``tenacity + 1``-th evaluation in all (not in a
  row) that is no better stops it; at most ``max_epoch // epoch_size + 1`` such rounds; the best copy
  is the result;
* the L2 grid 1e-5, 1e-4, 1e-3, 1e-2 (SentEval's ``10**t for t in range(-5, -1)``), scores ×100
  rounded to 2 decimals before they are compared (the first best wins) or averaged;
* the three validations, with scikit-learn's shuffled StratifiedKFold (seed 1111) as SentEval uses
  it: :meth:`SentEvalProbe.cross_validate` (MR, CR, SUBJ, MPQA: SentEval's InnerKFoldClassifier),
  :meth:`SentEvalProbe.train_test` (TREC, MRPC: KFoldClassifier) and :meth:`SentEvalProbe.split`
  (SST2: SplitClassifier).

The probes of one validation are independent, so they are trained side by side: one stacked
weight, one ``bmm`` per step and one optimiser over the stack (Adam and RMSprop work element by
element, so each probe's update is the one it would get alone), each probe reading its own rows in
its own order. The probes of one fold at every L2 strength read the same rows in the same order, so
a step gathers those rows once for all of them. Probes need the same number of minibatches per epoch
to share steps; those that differ are trained in separate groups. A fold whose probes have all
stopped is dropped from the stack. The result is the same probes SentEval trains one after the
other, in a fraction of the time (``docs/BENCHMARKS.md``).
"""
from __future__ import annotations

import math
import os
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from joblib import Parallel, delayed
from sklearn.model_selection import StratifiedKFold

SEED = 1111  # SentEval's seed: the folds, the probe's initialisation and its data order
L2_GRID = (1e-5, 1e-4, 1e-3, 1e-2)  # SentEval's 10**t for t in range(-5, -1), usepytorch=True
OPTIMIZERS = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop}  # at torch's default settings


def percent(accuracy):
    """Accuracy ×100 rounded to 2 decimals, as SentEval rounds every score it compares or averages."""
    return np.round(100 * np.asarray(accuracy, dtype=np.float64), 2)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform says, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op threads set to ``threads`` inside the block (None: left as they are)."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- one probe's data: its rows and the order numpy's generator gives them ------------------------
@dataclass
class Fit:
    """One probe to train: the rows of ``x`` it trains on, the rows it is validated on (None: it
    holds out ``validation_split`` of ``train``, drawn by its own generator) and its L2 strength."""

    train: np.ndarray
    valid: np.ndarray | None
    l2: float


@dataclass
class Trained:
    """A trained probe: its best copy (``weight`` [classes, D], ``bias`` [classes]) and that copy's
    accuracy on its validation rows (a fraction)."""

    weight: torch.Tensor
    bias: torch.Tensor
    valid_accuracy: float

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight.t()).argmax(-1)

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return (self.predict(x) == y).double().mean().item()


def _generator(rows: int, holds_out: bool, seed: int) -> tuple[np.random.RandomState, np.ndarray | None]:
    """A probe's generator, as SentEval's probe uses numpy's global one right after
    ``np.random.seed(seed)``: with ``holds_out``, its first draw is a permutation of the ``rows``
    rows (returned) that splits off the validation rows; every later draw orders one epoch."""
    generator = np.random.RandomState(seed)
    return generator, generator.permutation(rows) if holds_out else None


@dataclass
class _Plan:
    """A :class:`Fit` resolved: its training and validation rows (in the order the probe sees them)
    and the key of its generator's stream (probes with the same key draw the same permutations)."""

    train: np.ndarray
    valid: np.ndarray
    l2: float
    stream: tuple[int, bool]


def _resolve(fit: Fit, settings: "SentEvalProbe") -> _Plan:
    train = np.asarray(fit.train)
    if fit.valid is not None:
        return _Plan(train, np.asarray(fit.valid), fit.l2, (len(train), False))
    _, order = _generator(len(train), True, settings.seed)
    # SentEval's int(0.05 n); at least one row, where SentEval would stop with an empty set (n < 20)
    held = max(1, int(settings.validation_split * len(train)))
    return _Plan(train[order[held:]], train[order[:held]], fit.l2, (len(train), True))


def linear_init(dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """nn.Linear(dim, classes)'s weight and bias as they are right after ``torch.manual_seed(seed)``,
    which is how SentEval builds each probe (the global generator is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = torch.nn.Linear(dim, classes)
    return layer.weight.detach(), layer.bias.detach()


# ---- training probes side by side --------------------------------------------------------------------
class _Stack:
    """Probes trained together as one stacked linear layer. ``sets`` holds sets of ``k`` probes
    each (the same ``k`` for all, ``steps`` minibatches an epoch for all); the probes of a set read
    the same rows in the same order and are validated on the same rows (they differ in their L2
    strength), so a step reads each set's minibatch once and scores all its probes with one
    ``[k * classes, D]`` weight. ``train()`` returns a :class:`Trained` for each probe, set by set."""

    def __init__(self, x, y, sets: list[list[_Plan]], settings: "SentEvalProbe", classes: int):
        self.x, self.y, self.settings = x, y, settings
        self.plans = [members[0] for members in sets]  # each set's rows and generator stream
        batch, g, k = settings.batch_size, len(sets), len(sets[0])
        self.steps = math.ceil(len(self.plans[0].train) / batch)
        # each probe's loss is the mean over its own minibatch: weights 1/size, 0 on the padding
        self.share = torch.zeros(g, self.steps * batch)
        for i, plan in enumerate(self.plans):
            n = len(plan.train)
            last = n - (self.steps - 1) * batch
            self.share[i, :n] = 1.0 / batch
            self.share[i, (self.steps - 1) * batch:n] = 1.0 / last
        weight, bias = linear_init(x.shape[1], classes, settings.seed)
        self.weight = weight.expand(g, k, -1, -1).clone().requires_grad_()  # [sets, k, classes, D]
        self.bias = bias.expand(g, k, -1).clone().requires_grad_()  # [sets, k, classes]
        self.l2 = torch.tensor([[p.l2 for p in members] for members in sets], dtype=x.dtype)
        self.optimizer = OPTIMIZERS[settings.optim]([self.weight, self.bias])
        self.active = torch.arange(g)  # the set of each row of the stack
        self.best_weight, self.best_bias = self.weight.detach().clone(), self.bias.detach().clone()
        self.best = np.full((g, k), -1.0)
        self.misses = np.zeros((g, k), dtype=int)
        self.stopped = np.zeros((g, k), dtype=bool)  # a stopped probe trains on with its set, unread
        # one generator per stream, and the number of rows it permutes each epoch
        self.streams = {p.stream: (_generator(*p.stream, settings.seed)[0], len(p.train)) for p in self.plans}

    def _orders(self) -> torch.Tensor:
        """[active, steps * batch]: the rows each active set reads this epoch, in its order (one
        permutation per stream, padded with row 0 where a set has fewer rows)."""
        drawn = {key: generator.permutation(rows) for key, (generator, rows) in self.streams.items()}
        order = torch.zeros(len(self.plans), self.share.shape[1], dtype=torch.long)
        for i in self.active.tolist():
            plan = self.plans[i]
            order[i, :len(plan.train)] = torch.from_numpy(plan.train[drawn[plan.stream]])
        return order[self.active]

    def _epoch(self) -> None:
        order, share, batch = self._orders(), self.share[self.active], self.settings.batch_size
        k, classes = self.weight.shape[1:3]
        for step in range(self.steps):
            rows = order[:, step * batch:(step + 1) * batch]
            logits = torch.baddbmm(self.bias.flatten(1).unsqueeze(1), self.x[rows],
                                   self.weight.flatten(1, 2).transpose(1, 2))  # [sets, batch, k * classes]
            targets = self.y[rows].unsqueeze(-1).expand(-1, -1, k)
            losses = F.cross_entropy(logits.reshape(-1, classes), targets.flatten(), reduction="none")
            self.optimizer.zero_grad(set_to_none=False)
            weights = share[:, step * batch:(step + 1) * batch].unsqueeze(-1).expand(-1, -1, k)
            (losses * weights.flatten()).sum().backward()
            with torch.no_grad():  # SentEval's weight decay: Adam's and RMSprop's L2 term on the gradient
                self.weight.grad.add_(self.weight * self.l2[:, :, None, None])
                self.bias.grad.add_(self.bias * self.l2[:, :, None])
            self.optimizer.step()

    @torch.no_grad()
    def _validate(self) -> np.ndarray:
        """[active, k]: each probe's accuracy on its set's validation rows."""
        scores = []
        for row, i in enumerate(self.active.tolist()):
            rows = torch.from_numpy(self.plans[i].valid)
            logits = torch.addmm(self.bias[row].flatten(), self.x[rows], self.weight[row].flatten(0, 1).t())
            right = logits.unflatten(-1, self.weight.shape[1:3]).argmax(-1) == self.y[rows, None]
            scores.append(right.sum(0).numpy() / len(rows))
        return np.stack(scores)

    def _keep(self, keep: torch.Tensor) -> None:
        """Drop the sets whose probes have all stopped from the stack, their optimiser state with them."""
        state = self.optimizer.state
        weight = self.weight.detach()[keep].clone().requires_grad_()
        bias = self.bias.detach()[keep].clone().requires_grad_()
        optimizer = type(self.optimizer)([weight, bias], **self.optimizer.defaults)
        for old, new in ((self.weight, weight), (self.bias, bias)):
            optimizer.state[new] = {k: v[keep].clone() if torch.is_tensor(v) and v.dim() else v
                                    for k, v in state[old].items()}
        self.weight, self.bias, self.optimizer = weight, bias, optimizer
        self.l2, self.active = self.l2[keep], self.active[keep]

    def train(self) -> list[Trained]:
        s = self.settings
        for _ in range(s.max_epoch // s.epoch_size + 1):
            for _ in range(s.epoch_size):
                self._epoch()
            scores = self._validate()
            sets = self.active.numpy()
            running = ~self.stopped[sets]
            better = running & (scores > self.best[sets])
            worse = running & ~better
            row, probe = np.nonzero(better)
            self.best[sets[row], probe] = scores[row, probe]
            self.best_weight[sets[row], probe] = self.weight.detach()[row, probe]
            self.best_bias[sets[row], probe] = self.bias.detach()[row, probe]
            row, probe = np.nonzero(worse)
            self.stopped[sets[row], probe] = self.misses[sets[row], probe] >= s.tenacity
            self.misses[sets[row], probe] += 1
            keep = torch.from_numpy(~self.stopped[sets].all(axis=1))
            if not keep.any():
                break
            if not keep.all():
                self._keep(keep)
        return [Trained(self.best_weight[i, j], self.best_bias[i, j], float(self.best[i, j]))
                for i in range(len(self.plans)) for j in range(self.best.shape[1])]


def _train_stack(x, y, sets: list[list[_Plan]], settings: "SentEvalProbe", classes: int) -> list[Trained]:
    """One stack, on one thread: its tensors are small, and on a busy machine a parallel region
    per small op waits for every thread it uses, so the cores go to separate stacks instead."""
    with torch_threads(1):
        x, y = torch.tensor(np.asarray(x)), torch.tensor(np.asarray(y))  # a copy: a memory map is read-only
        return _Stack(x, y, sets, settings, classes).train()


def train_probes(x: torch.Tensor, y: torch.Tensor, fits: list[Fit], settings: "SentEvalProbe",
                 classes: int) -> list[Trained]:
    """Train a probe for each of ``fits`` on the rows of ``x`` [N, D] (float32) and ``y`` [N]
    (class indices), as SentEval trains each one alone; the :class:`Trained` probes in order.
    Probes that read the same rows (the same training and validation rows: one fold at each L2
    strength) form a set; sets of as many probes, with as many minibatches an epoch, share a stack
    of at most ``settings.stack`` probes, split so that ``settings.jobs`` processes each get one
    where there are enough (a set itself is split where there are fewer sets than processes)."""
    plans = [_resolve(fit, settings) for fit in fits]
    same_rows = defaultdict(list)
    for i, plan in enumerate(plans):
        same_rows[plan.stream, plan.train.tobytes(), plan.valid.tobytes()].append(i)
    jobs = settings.jobs or 1
    # fewer sets than processes (SST2's one set of every L2 strength): sets split between them
    pieces = math.ceil(jobs / len(same_rows))
    buckets = defaultdict(list)  # (minibatches an epoch, probes a set): the sets that can share a stack
    for members in same_rows.values():
        length = min(settings.stack, math.ceil(len(members) / pieces))
        for start in range(0, len(members), length):
            piece = members[start:start + length]
            buckets[math.ceil(len(plans[piece[0]].train) / settings.batch_size), len(piece)].append(piece)
    chunks = []
    for (_, k), sets in buckets.items():
        size = max(1, min(settings.stack // k, math.ceil(len(sets) / jobs)))
        chunks += [sets[start:start + size] for start in range(0, len(sets), size)]
    work = [[[plans[i] for i in members] for members in chunk] for chunk in chunks]
    if jobs > 1 and len(chunks) > 1:  # joblib hands x to the workers as a memory map, not a copy each
        stacks = Parallel(n_jobs=min(jobs, len(chunks)))(
            delayed(_train_stack)(x.numpy(), y.numpy(), w, settings, classes) for w in work)
    else:
        stacks = [_train_stack(x, y, w, settings, classes) for w in work]
    trained = [None] * len(plans)
    for chunk, stack in zip(chunks, stacks):
        for i, probe in zip((i for members in chunk for i in members), stack):
            trained[i] = probe
    return trained


# ---- SentEval's three validations ----------------------------------------------------------------
@dataclass(frozen=True)
class SentEvalProbe:
    """SentEval's PyTorch probe and its validations; the defaults are SentEval's test settings
    (its README's "default config": 10 folds, Adam, batch 64, tenacity 5, epoch size 4), and
    :data:`FASTTEST` its prototyping ones. ``stack``: at most this many probes trained side by side
    (memory: a step reads at most ``stack × batch_size`` rows); ``jobs``: processes that train stacks at
    the same time (None: one, this one). Every method returns ``accuracy`` and ``devacc`` (×100,
    rounded to 2 decimals, as SentEval reports them)."""

    folds: int = 10
    optim: str = "adam"
    batch_size: int = 64
    tenacity: int = 5
    epoch_size: int = 4
    max_epoch: int = 200
    l2_grid: tuple[float, ...] = L2_GRID
    validation_split: float = 0.05
    seed: int = SEED
    stack: int = 256
    jobs: int | None = None
    name: str = field(default="senteval", init=False)

    def __post_init__(self):
        if self.optim not in OPTIMIZERS:
            raise ValueError(f"optim must be one of {', '.join(OPTIMIZERS)}, not {self.optim!r}")

    def kfold(self) -> StratifiedKFold:
        return StratifiedKFold(n_splits=self.folds, shuffle=True, random_state=self.seed)

    def _pick(self, fold_scores: np.ndarray) -> tuple[int, float]:
        """SentEval's choice of L2 from [grid, folds] validation accuracies: each strength's mean ×100
        rounded to 2 decimals, the first best; (its index, its score)."""
        scores = percent(np.asarray(fold_scores).mean(axis=1))
        return int(np.argmax(scores)), float(scores.max())

    def cross_validate(self, x, y) -> dict:
        """SentEval's InnerKFoldClassifier: k folds over all items; in each, the L2 strength picked by
        an inner k-fold on its training part (each inner probe stops early on its inner test fold),
        then a probe on the whole training part (5% held out to stop it) scored on the test fold.
        ``accuracy``: the mean of the folds' rounded test accuracies; ``devacc``: of their best
        inner scores."""
        x, y, classes = _tensors(x, y)
        outer = list(self.kfold().split(np.zeros(len(y)), y.numpy()))
        inner = [[(train[a], train[b]) for a, b in self.kfold().split(np.zeros(len(train)), y[train].numpy())]
                 for train, _ in outer]
        fits = [Fit(a, b, l2) for folds in inner for l2 in self.l2_grid for a, b in folds]
        scores = np.array([p.valid_accuracy for p in train_probes(x, y, fits, self, classes)])
        picks = [self._pick(s) for s in scores.reshape(len(outer), len(self.l2_grid), self.folds)]
        finals = train_probes(x, y, [Fit(train, None, self.l2_grid[i]) for (train, _), (i, _) in zip(outer, picks)],
                              self, classes)
        tests = [percent(p.accuracy(x[test], y[test])) for p, (_, test) in zip(finals, outer)]
        devacc = np.mean([score for _, score in picks])
        return {"accuracy": float(np.round(np.mean(tests), 2)), "devacc": float(np.round(devacc, 2))}

    def train_test(self, x, y, xt, yt) -> dict:
        """SentEval's KFoldClassifier: the L2 strength picked by k-fold validation on train (each
        probe stops early on its test fold), then a probe on all of train (5% held out to stop
        it) scored on test. Also ``predicted``: its test predictions (np.ndarray)."""
        x, y, classes = _tensors(x, y)
        xt, yt, test_classes = _tensors(xt, yt)
        classes = max(classes, test_classes)
        folds = list(self.kfold().split(np.zeros(len(y)), y.numpy()))
        fits = [Fit(a, b, l2) for l2 in self.l2_grid for a, b in folds]
        scores = np.array([p.valid_accuracy for p in train_probes(x, y, fits, self, classes)])
        pick, devacc = self._pick(scores.reshape(len(self.l2_grid), self.folds))
        final = train_probes(x, y, [Fit(np.arange(len(y)), None, self.l2_grid[pick])], self, classes)[0]
        predicted = final.predict(xt)
        return {"accuracy": float(percent((predicted == yt).double().mean().item())), "devacc": devacc,
                "predicted": predicted.numpy()}

    def split(self, x, y, xd, yd, xt, yt) -> dict:
        """SentEval's SplitClassifier: a probe for each L2 strength on train, stopped early on dev;
        the one with the best rounded dev accuracy (the first of equals) scored on test. (SentEval
        trains that probe again, with the same seed on the same data: the same probe.)"""
        n, nd = len(y), len(yd)
        x, y, classes = _tensors(torch.cat([_tensor(x), _tensor(xd), _tensor(xt)]),
                                 np.concatenate([np.asarray(y), np.asarray(yd), np.asarray(yt)]))
        train, dev, test = np.arange(n), np.arange(n, n + nd), np.arange(n + nd, len(y))
        probes = train_probes(x, y, [Fit(train, dev, l2) for l2 in self.l2_grid], self, classes)
        pick, devacc = self._pick(np.array([[p.valid_accuracy] for p in probes]))
        return {"accuracy": float(percent(probes[pick].accuracy(x[test], y[test]))), "devacc": devacc}


#: SentEval's README, "prototyping config" (its settings for fast iteration).
FASTTEST = SentEvalProbe(folds=5, optim="rmsprop", batch_size=128, tenacity=3, epoch_size=2)
#: SentEval's README, "default config", for results "comparable to the literature".
TEST = SentEvalProbe()


def _tensor(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x).float().contiguous()


def _tensors(x, y) -> tuple[torch.Tensor, torch.Tensor, int]:
    """float32 features (SentEval's probe casts them so), int64 labels and the number of classes."""
    y = torch.as_tensor(np.asarray(y), dtype=torch.long)
    return _tensor(x), y, int(y.max()) + 1


