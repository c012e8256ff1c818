"""A resumable data order: the index stream every training command draws its batches from."""
from __future__ import annotations

import torch

from ..config.pretrain import MIX_SAMPLINGS
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


class DatasetChooser:
    """Which dataset of a mixture each step draws its batch from: ``round-robin``, each in turn, or
    ``proportional``, a seeded draw weighted by their sizes (sentence-transformers'
    MultiDatasetBatchSampler's two). Every rank draws alike; its state makes a resumed run draw on
    exactly as an uninterrupted one."""

    def __init__(self, sizes: dict[str, int], sampling: str, seed: int):
        if sampling not in MIX_SAMPLINGS:
            raise UsageError(f"a mixture's sampling is one of {', '.join(MIX_SAMPLINGS)}, not {sampling!r}")
        empty = [name for name, n in sizes.items() if n < 1]
        if empty:
            raise UsageError(f"the mixture's dataset {', '.join(empty)} has no examples")
        self.names, self.sampling, self.step = list(sizes), sampling, 0
        self.weights = torch.tensor([float(sizes[n]) for n in self.names])
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> str:
        if self.sampling == "round-robin":
            i = self.step % len(self.names)
        else:
            i = int(torch.multinomial(self.weights, 1, generator=self.generator))
        self.step += 1
        return self.names[i]

    def state_dict(self) -> dict:
        return {"step": self.step, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]
        self.generator.set_state(state["generator"])
