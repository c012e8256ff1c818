"""What a training run trains on (``Examples``): columns of sentences and, for the supervised
objectives, a label per example."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Examples:
    """``columns``: k lists of n sentences, example i being row i of each (a corpus: one column;
    pairs: two; triples: three); ``labels``: None, or a tensor whose row i is example i's label
    (class ids [n], similarities [n], a teacher's vectors [n, D']); ``classes``: the class names of
    class-id labels; ``what``: where they come from, in words.

        Examples([sentences])                                  # a corpus
        Examples([premises, entailments, contradictions])      # supervised SimCSE's triples
        Examples([s1, s2], labels=torch.tensor(scores) / 5)    # scored pairs (SBERT's regression)
    """

    columns: list[list[str]]
    labels: torch.Tensor | None = None
    classes: tuple[str, ...] = ()
    what: str = ""

    def __post_init__(self):
        if not self.columns or any(len(c) != len(self.columns[0]) for c in self.columns):
            raise ValueError("Examples: the columns must be one or more lists of the same length")
        if self.labels is not None and len(self.labels) != len(self.columns[0]):
            raise ValueError(f"Examples: {len(self.labels)} labels for {len(self.columns[0])} examples")

    def __len__(self) -> int:
        return len(self.columns[0])
