"""The multitask stage's data (CS224N SST-5, QQP and STS files): each file read and tokenised once
(``TaskData``), from a run's settings (``load_data``: the per-file settings or the standard names
in the data directory, downloaded when missing)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from ..errors import DataError
from .download import fetch_missing
from .tasks import READERS, SPLITS, TASKS, task_file

logger = logging.getLogger("bertcf.multitask")


@dataclass
class TaskData:
    """One task file, tokenised once: ``ids`` [n]; ``tokens``: one list of token-id lists per
    text column (1 for SST, 2 for pairs; 1 for a pair encoded jointly, ``[CLS] s1 [SEP] s2
    [SEP]``); ``labels`` [n] (None for unlabeled rows); ``token_types``: a jointly encoded pair's
    token types (0 for s1, 1 for s2) per row, else None."""

    task: str
    path: Path
    ids: list[str]
    tokens: tuple[list[list[int]], ...]
    labels: list = field(default_factory=list)
    token_types: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, rows) -> "TaskData":
        rows = list(rows)
        types = None if self.token_types is None else [self.token_types[i] for i in rows]
        return TaskData(self.task, self.path, [self.ids[i] for i in rows],
                        tuple([col[i] for i in rows] for col in self.tokens), [self.labels[i] for i in rows], types)

    def labeled(self, limit: int | None = None) -> "TaskData":
        """The rows with a label (the first ``limit`` of them)."""
        rows = [i for i, label in enumerate(self.labels) if label is not None]
        return self.subset(rows[:limit] if limit else rows)

    @cached_property
    def label_tensor(self) -> torch.Tensor:
        """The labels as a tensor (long for SST, float32 for pairs); labeled sets only."""
        dtype = torch.long if self.task == "sst" else torch.float32
        return torch.tensor(self.labels, dtype=dtype)


def tokenize_column(tokenizer, sentences, max_length: int) -> list[list[int]]:
    return tokenizer(list(sentences), truncation=True, max_length=max_length,
                     return_attention_mask=False, return_token_type_ids=False)["input_ids"]


def _columns(task, rows):
    if task == "sst":
        return ([r.sentence for r in rows],)
    return [r.sentence1 for r in rows], [r.sentence2 for r in rows]


def load_task(task: str, split: str, path, tokenizer, max_length: int, limit: int | None = None,
              joint: bool = False) -> TaskData:
    """Read and tokenise one file. train: labeled rows (the first ``limit``); dev: every row,
    with the labels of the labeled ones (every id gets a prediction); test: every row.
    ``joint``: a pair task's two sentences tokenised together (the tokenizer's pair encoding, at
    most ``max_length`` tokens in all, the longer sentence cut first)."""
    path = Path(path)
    reader = READERS[task]
    if split == "train":
        rows = reader(path, labeled=True)[:limit]
        labels = [r.label for r in rows]
    elif split == "dev":
        gold = {r.id: r.label for r in reader(path, labeled=True)}
        data_logger = logging.getLogger("bertcf.data")
        level = data_logger.level
        data_logger.setLevel(logging.ERROR)  # the labeled read above already warned about skipped rows
        try:
            rows = reader(path, labeled=False)
        finally:
            data_logger.setLevel(level)
        labels = [gold.get(r.id) for r in rows]
    else:
        rows = reader(path, labeled=False)
        labels = [None] * len(rows)
    if task == "sst":
        labels = [None if l is None else int(l) for l in labels]
    if joint and task != "sst":
        ids, types = tokenize_pairs(tokenizer, *_columns(task, rows), max_length)
        return TaskData(task, path, [r.id for r in rows], (ids,), labels, types)
    tokens = tuple(tokenize_column(tokenizer, col, max_length) for col in _columns(task, rows))
    return TaskData(task, path, [r.id for r in rows], tokens, labels)


def tokenize_pairs(tokenizer, first, second, max_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """``[CLS] a [SEP] b [SEP]`` ids and token types (0 for a, 1 for b), the longer text cut first."""
    encoded = tokenizer(list(first), list(second), truncation="longest_first", max_length=max_length,
                        return_token_type_ids=True, return_attention_mask=False)
    return encoded["input_ids"], encoded["token_type_ids"]


def task_paths(config) -> dict:
    """(task, split) -> Path from the per-file settings of ``config`` (``config.task_file(task,
    split)``; default: the standard names in ``config.data_dir``)."""
    return {(t, s): Path(config.task_file(t, s) or task_file(config.data_dir, t, s)) for t in TASKS for s in SPLITS}


def check_files(config, splits=SPLITS, why: str | None = None) -> dict:
    """task_paths(config), after checking that the train and dev files among ``splits`` exist
    (``why``: why a missing one was not downloaded, for the error line)."""
    paths = task_paths(config)
    for (task, split), path in paths.items():
        if split in splits and split != "test" and not path.is_file():
            because = f"; {why}" if why else ""
            raise DataError(f"{path} not found (set --data-dir or --{task}-{split}{because})")
    return paths


def fetch_data(config) -> str | None:
    """When a train or dev file is missing from --data-dir (where no --{task}-{split} flag points
    elsewhere), download the missing CS224N files, the test files too (for the predictions);
    returns why that failed, or None."""
    missing = {(t, s): task_file(config.data_dir, t, s) for t in TASKS for s in SPLITS
               if config.task_file(t, s) is None and not task_file(config.data_dir, t, s).is_file()}
    if all(split == "test" for _, split in missing):
        return None
    return fetch_missing(config.data_dir, [path.name for path in missing.values()])


def load_data(config, tokenizer, max_length: int, splits=SPLITS, pair_encoding: str = "bi") -> dict:
    """(task, split) -> TaskData, or None for an absent test file (skipped with a warning).
    Train and dev files must exist (DataError otherwise), checked before anything is read.
    ``pair_encoding`` cross: the pair tasks tokenised jointly."""
    paths = check_files(config, splits)
    data = {}
    for (task, split), path in paths.items():
        if split not in splits:
            continue
        if split == "test" and not path.exists():
            logger.warning("warning: %s not found: no %s test predictions", path, task)
            data[task, split] = None
            continue
        limit = config.max_train_examples if split == "train" else None
        data[task, split] = load_task(task, split, path, tokenizer, max_length, limit, pair_encoding == "cross")
    return data
