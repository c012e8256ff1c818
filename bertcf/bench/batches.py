"""The benchmark's inputs: random token ids with realistic variable lengths (a log-normal around
each task's typical length, clipped to its max length), [CLS] ... [SEP] and dynamic padding."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

#: Sentence lengths in tokens (with [CLS]/[SEP]) per workload: (median, max length).
LENGTHS = {"mirror": (24, 32), "sst": (26, 128), "qqp": (15, 128), "sts": (14, 128), "encode": (14, 128)}


@dataclass
class Batch:
    ids: torch.Tensor
    mask: torch.Tensor
    lengths: list = field(default_factory=list)
    special: torch.Tensor | None = None  # [CLS]/[SEP]/padding, for a pretraining objective

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def hidden(self, bert):
        """The last hidden state [b, t, D] of an :class:`~bertcf.bench.models.Encoder`."""
        return bert(self.ids, self.mask, num_tokens=self.tokens)["last_hidden_state"]


def sample_lengths(n: int, median: int, max_len: int, g: torch.Generator) -> list[int]:
    lengths = torch.exp(math.log(median) + 0.45 * torch.randn(n, generator=g)).round().long()
    return lengths.clamp(4, max_len).tolist()


def make_batch(lengths, vocab_size: int, g: torch.Generator, device, special=(101, 102)) -> Batch:
    """[CLS] w1 .. wn [SEP] + padding to the longest (dynamic padding)."""
    cls_id, sep_id = special
    t = max(lengths)
    low = 1000 if vocab_size > 2000 else 5  # skip [PAD], [unused..], [CLS], [SEP], [MASK]
    ids = torch.randint(low, vocab_size, (len(lengths), t), generator=g)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, 0], ids[i, n - 1] = cls_id, sep_id
    ids = ids * mask
    return Batch(ids.to(device), mask.to(device), list(lengths))


def special_ids(vocab_size: int):
    """([CLS], [SEP], [MASK]) of the uncased vocabulary, or of the test vocabulary when small."""
    return (101, 102, 103) if vocab_size > 2000 else (2, 3, 4)
