"""The resumable data orders every training command draws its batches from: the examples of a
dataset (``EpochSampler``, ``NoDuplicatesSampler``) and which dataset a step draws (``TaskSampler``)."""
from __future__ import annotations

import torch

from ..errors import UsageError


class EpochSampler:
    """An endless stream of indices into n items: a fresh seeded permutation every epoch.

    Its whole state is (epoch, position), so a resumed run reads exactly the examples an
    uninterrupted one would. Under DDP every rank draws the same global batch and keeps
    its own slice of it, so ``--batch-size`` stays the global batch."""

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        if n < 1:
            raise UsageError("no examples to train on")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    def _permutation(self):
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed + 1_000_003 * self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            take = min(k - len(out), self.n - self.position)
            out += self._order[self.position:self.position + take]
            self.position += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation()


class NoDuplicatesSampler:
    """An endless stream of batches in which no text appears twice (sentence-transformers'
    NoDuplicatesBatchSampler, for losses whose in-batch negatives a repeated text would make false:
    NLI premises recur across their triples).

    Each epoch is a seeded permutation, as ``EpochSampler``'s; a batch takes the next examples in
    that order whose texts (every column's) are not in the batch yet, and an example it skips
    stays, in its place, for a later batch. A batch the epoch's remaining examples cannot fill goes
    on into the next epoch's permutation. Its state is the epoch and the examples it has left, so
    a resumed run draws exactly the batches an uninterrupted one would."""

    def __init__(self, texts: list[tuple[str, ...]], seed: int):
        if not texts:
            raise UsageError("no examples to train on")
        self.texts, self.seed = texts, seed
        self.epoch, self.remaining = 0, self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + 1_000_003 * epoch)
        return torch.randperm(len(self.texts), generator=g).tolist()

    def _take(self, candidates: list[int], k: int, batch: list[int], seen: set) -> list[int]:
        """Add to ``batch`` the ``candidates`` whose texts ``seen`` lacks, up to k; return the others."""
        left = []
        for i in candidates:
            if len(batch) < k and not seen.intersection(self.texts[i]):
                batch.append(i)
                seen.update(self.texts[i])
            else:
                left.append(i)
        return left

    def next(self, k: int) -> list[int]:
        batch, seen = [], set()
        self.remaining = self._take(self.remaining, k, batch, seen)
        if len(batch) < k:  # the epoch is spent: the next one's permutation, after what this one left
            self.epoch += 1
            self.remaining = self.remaining + self._take(self._permutation(self.epoch), k, batch, seen)
        if len(batch) < k:
            raise too_few_texts(k)
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "remaining": list(self.remaining)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.remaining = state["epoch"], list(state["remaining"])


def too_few_texts(k: int, what: str = "the data", counts: str = "") -> UsageError:
    return UsageError(f"a batch of {k} examples without a repeated text cannot be made: {what} has too few distinct "
                      f"texts{counts} (give a smaller --batch-size, or --batch-sampler random)")


def check_distinct(texts: list[tuple[str, ...]], k: int, what: str = "the data") -> None:
    """Refuse examples (each a tuple of texts) from which ``NoDuplicatesSampler`` can make no batch of
    k: the k examples of a batch need k disjoint sets of texts, so at least as many distinct texts as
    the k smallest of those sets hold together. The training commands call this before they write
    anything (the sampler itself meets the shortfall only at step 1, after the step-0 evaluation
    wrote the run directory). Data that passes may still, rarely, leave the sampler's greedy fill
    short later; that stops the run there, its checkpoints kept."""
    sizes = sorted(len(set(example)) for example in texts)
    needed = sum(sizes[:k]) if len(sizes) >= k else None
    distinct = len(set().union(*map(set, texts))) if texts else 0
    if needed is None or distinct < needed:
        wanted = f"{k} examples" if needed is None else str(needed)
        raise too_few_texts(k, what, f", {distinct} in {len(texts)} examples where a batch of {k} needs {wanted}")


MODES = ("all", "round-robin", "proportional", "temperature", "annealed")


class TaskSampler:
    """Which datasets a step draws a batch from: stage 3's tasks (``--task-sampling``) and a
    mixture's parts (``run_pretrain.py --mix-sampling``), as the multitask literature samples them:

    - ``all``: one batch of every dataset each step (the report's stage 3; the losses summed);
    - ``round-robin``: one a step, in turn;
    - ``proportional``: one a step, drawn with probability proportional to its size (Sanh et al.
      2019, "A Hierarchical Multi-task Approach"; sentence-transformers' MultiDatasetBatchSampler);
    - ``temperature``: one a step, with probability proportional to size^(1/T), as multilingual
      models sample languages (Arivazhagan et al. 2019; T = 1 is proportional, a large T nearly
      uniform);
    - ``annealed``: one a step, probability proportional to size^alpha with alpha going from 1
      (proportional) to 0.2 (near uniform) over training (Stickland & Murray 2019, "BERT and PALs",
      their "annealed sampling": alpha = 1 - 0.8 (e - 1) / (E - 1) over E epochs; here over the steps).

    ``sizes``: name -> examples, in order; ``steps``: the run's length (for ``annealed``);
    ``temperature``: T of ``temperature``. A draw depends only on the seed and the step (its own
    generator, seeded from both), so every rank draws alike and a resumed run continues the same
    sequence; the batches each dataset got are counted (``counts``), saved with the run and logged."""

    def __init__(self, mode: str, sizes: dict, steps: int, seed: int, temperature: float = 2.0):
        if mode not in MODES:
            raise UsageError(f"the sampling must be one of {', '.join(MODES)}, not {mode!r}")
        if not temperature > 0:
            raise UsageError(f"--sampling-temperature must be positive, not {temperature}")
        empty = [name for name, n in sizes.items() if n < 1]
        if empty:
            raise UsageError(f"{', '.join(empty)}: no examples to train on")
        self.mode, self.tasks, self.steps, self.seed = mode, list(sizes), steps, seed
        self.sizes = torch.tensor([float(sizes[t]) for t in self.tasks], dtype=torch.float64)
        self.temperature = temperature
        self.counts = dict.fromkeys(self.tasks, 0)

    def probabilities(self, step: int) -> torch.Tensor:
        """The chance of each dataset at ``step`` (float64 [datasets]); ``all`` and ``round-robin``
        draw nothing (uniform is returned for them)."""
        if self.mode == "proportional":
            alpha = 1.0
        elif self.mode == "temperature":
            alpha = 1.0 / self.temperature
        elif self.mode == "annealed":
            alpha = 1.0 - 0.8 * step / max(1, self.steps - 1)
        else:
            return torch.full_like(self.sizes, 1.0 / len(self.tasks))
        weights = self.sizes ** alpha
        return weights / weights.sum()

    def tasks_at(self, step: int) -> list[str]:
        """The datasets of step ``step`` (counted)."""
        if self.mode == "all":
            chosen = list(self.tasks)
        elif self.mode == "round-robin":
            chosen = [self.tasks[step % len(self.tasks)]]
        else:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            chosen = [self.tasks[int(torch.multinomial(self.probabilities(step), 1, generator=g))]]
        for task in chosen:
            self.counts[task] += 1
        return chosen

    def state_dict(self) -> dict:
        return {"counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        if "counts" not in state:  # the mixture's chooser before the two shared this class drew otherwise
            raise UsageError("--resume: this run's mixture was drawn by an earlier version, whose draws this one "
                             "does not continue; start a new run")
        self.counts = dict.fromkeys(self.tasks, 0) | {k: v for k, v in state["counts"].items() if k in self.counts}
