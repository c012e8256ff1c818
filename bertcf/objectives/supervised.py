"""What the supervised objectives (``run_pretrain.py --stage supervised``) share: their training
files (``--train-file``), and the shape of an objective that trains on labelled tuples of
sentences (``Supervised``)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..data.examples import Examples
from ..data.pairs import FORMATS, SCALE, LabelledPairs, read_pairs
from ..data.tasks import task_file
from ..errors import UsageError
from ..utils.distributed import local_rows
from .base import Objective
from .settings import MatryoshkaSettings


def train_files(config, default=None) -> list[Path]:
    """--train-file's files (``config.train_file``), or ``default`` (a list) when none is given; a
    UsageError when there is neither."""
    files = config.train_file or default
    if not files:
        raise UsageError(f"--method {config.method} needs --train-file FILE [FILE ...] ({FORMATS})")
    return [Path(f) for f in files]


def read_labelled(config, kinds: tuple[str, ...], default=None) -> LabelledPairs:
    """The labelled pairs of --train-file (or ``default``), which must be of one of ``kinds``
    (``data.pairs``: nli, qqp, sts)."""
    pairs = read_pairs(train_files(config, default))
    if pairs.kind not in kinds:
        raise UsageError(f"--method {config.method} trains on {' or '.join(kinds)} pairs, and "
                         f"{', '.join(pairs.sources)} holds {pairs.kind} pairs")
    return pairs


def sts_train_default(config) -> list[Path]:
    """The CS224N STS training file of --data-dir (sbert-cosine's default --train-file)."""
    return [task_file(config.data_dir, "sts", "train")]


class Supervised(Objective):
    """An objective that trains on labelled tuples of sentences rather than a corpus. The command
    reads them with the class (``read_examples``, from the run's settings) before the encoder is
    built, so a preset can measure the run in epochs; what sizes an objective's head comes from
    them (``from_examples``: SBERT's classifier, one output per class; distillation's projection,
    the teacher's width). From Python: ``SBERTSoftmax(encoder, num_labels=3)`` and an ``Examples``.

    A batch is the global batch of B examples, its ``len(columns)`` columns stacked: ids, mask,
    special [k B, t] (column j in rows j B .. (j + 1) B - 1, e.g. premises then hypotheses), and
    ``labels`` [B, ...] (the examples' rows of ``Examples.labels``)."""

    @classmethod
    def reads_corpus(cls, config) -> bool:
        """Whether the run reads the pretraining corpus (--corpus, --corpus-from-tasks, Wiki1M by
        default); the labelled methods read --train-file instead."""
        return False

    @classmethod
    def read_examples(cls, config, corpus) -> Examples:
        """The run's examples, from ``config`` (--train-file ...); ``corpus()`` returns the sentences
        of --corpus / --corpus-from-tasks, for an objective that can train on them."""
        raise NotImplementedError

    @classmethod
    def from_examples(cls, examples: Examples) -> dict:
        """The keyword arguments that ``examples`` give this objective (its head's size)."""
        return {}

    def column_embeddings(self, ids, mask, columns: int, rank: int, world: int) -> list[torch.Tensor]:
        """This rank's rows of each of the ``columns`` columns, encoded in one pass: ``columns``
        tensors [b, D]."""
        b = ids.shape[0] // columns
        rows = local_rows(b, rank, world)
        pick = torch.cat([torch.arange(b)[rows] + j * b for j in range(columns)])
        return list(self.embed(ids[pick], mask[pick]).chunk(columns))

    def local_labels(self, labels, b: int, rank: int, world: int) -> torch.Tensor:
        """This rank's rows of the global batch's ``labels`` [B, ...], on the device."""
        return labels[local_rows(b, rank, world)].to(self.device)

    def forward(self, ids, mask, special, rank: int = 0, world: int = 1, texts=None, labels=None):
        return self.loss(ids, mask, special, rank, world, labels=labels)

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        raise NotImplementedError




class ScoredPairs(Supervised):
    """An objective on pairs (s1, s2) with a gold similarity y [b] scaled to [0, 1] (STS: score / 5;
    QQP: duplicate 1, not 0), from --train-file or by default the CS224N STS training file of
    --data-dir (which holds pairs of STS-B's test set: an STS-B test score after it is not a
    held-out number); its loss compares f(s1) and f(s2) [b, D] (``MatryoshkaSettings`` apply)."""

    SETTINGS = (MatryoshkaSettings,)

    def __init__(self, encoder, **settings):
        super().__init__(encoder, **settings)
        self.matryoshka_widths(encoder.output_dim)

    @classmethod
    def read_examples(cls, config, corpus) -> Examples:
        pairs = read_labelled(config, ("sts", "qqp"), sts_train_default(config))
        gold = torch.tensor(pairs.labels, dtype=torch.float32) / SCALE[pairs.kind]
        return Examples([pairs.sentence1, pairs.sentence2], gold, (),
                        f"{len(pairs):,} {pairs.kind} pairs from {', '.join(pairs.sources)}")

    def pair_vectors(self, ids, mask, rank: int, world: int, labels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's (u, v, y): the two columns' vectors [b, D] and the gold scores [b]."""
        if labels is None:
            raise UsageError(f"{type(self).__name__} needs the pairs' gold similarities (labels)")
        u, v = self.column_embeddings(ids, mask, 2, rank, world)
        return u, v, self.local_labels(labels, ids.shape[0] // 2, rank, world).float()
