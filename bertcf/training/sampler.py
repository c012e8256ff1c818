"""A resumable data order: the index stream every training command draws its batches from."""
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
