"""Stage 3's data: each task's files read and tokenised once (``TaskData``). The built-in tasks read
the CS224N files with their readers (``bertcf.data.tasks``); any other task reads a delimited file
with a header, or JSON lines, by the columns its declaration names (``read_rows``)."""
from __future__ import annotations

import csv
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data.download import fetch_missing
from ..data.reading import not_text, open_text
from ..data.tasks import READERS, TASK_FILES
from ..models.cross_encoder import tokenize_pairs
from ..errors import DataError
from .tasks import JSON_SUFFIXES, SPLITS, Task

logger = logging.getLogger("bertcf.multitask")


EVAL_SAMPLE_SEED = 0  # the dev rows of a capped evaluation: one draw for every run, whatever --seed


def eval_sample(n: int, limit: int | None) -> list[int]:
    """The indices, in order, of the ``limit`` rows of ``n`` that a capped evaluation reads (all
    ``n`` without a limit): a draw with a fixed seed, so every run, and any other program that
    wants to score on the same rows, gets the same ones."""
    if not limit or limit >= n:
        return list(range(n))
    return sorted(torch.randperm(n, generator=torch.Generator().manual_seed(EVAL_SAMPLE_SEED))[:limit].tolist())


@dataclass
class TaskData:
    """One task file, tokenised once: ``ids`` [n], the rows' ids (as the prediction files key
    them); ``tokens``: one list of token-id lists per sentence the encoder reads of a row (1 for a
    sentence, 2 for a pair; 1 for a pair encoded jointly, ``[CLS] s1 [SEP] s2 [SEP]``); ``labels``
    [n] (None for unlabeled rows); ``token_types``: a jointly encoded pair's token types (0 for s1,
    1 for s2) per row, else None."""

    task: Task
    ids: list[str]
    tokens: tuple[list[list[int]], ...]
    labels: list = field(default_factory=list)
    token_types: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, rows) -> "TaskData":
        rows = list(rows)
        types = None if self.token_types is None else [self.token_types[i] for i in rows]
        return TaskData(self.task, [self.ids[i] for i in rows],
                        tuple([col[i] for i in rows] for col in self.tokens), [self.labels[i] for i in rows], types)

    def labeled(self, limit: int | None = None) -> "TaskData":
        """The rows with a label; with ``limit``, that many of them drawn at random, in file order,
        the same rows in every run (a file's first rows need not be like the rest: the CS224N SST
        dev file opens with 169 positive sentences in its first 200)."""
        rows = [i for i, label in enumerate(self.labels) if label is not None]
        return self.subset([rows[i] for i in eval_sample(len(rows), limit)])


# ---- reading ---------------------------------------------------------------------------------------
def _label(task: Task, text, where: str):
    """A label cell -> the class index (classification) or the score (regression)."""
    text = str(text).strip()
    if task.regression:
        try:
            value = float(text)
        except ValueError:
            raise DataError(f"task {task.name!r}: {where}: score {text!r} is not a number") from None
        lo, hi = task.label_range
        if not (math.isfinite(value) and lo <= value <= hi):
            raise DataError(f"task {task.name!r}: {where}: score {text!r} is outside label_range [{lo:g}, {hi:g}]")
        return value
    if task.labels is not None and text in task.labels:
        return task.labels.index(text)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value == int(value) and 0 <= value < task.num_classes):
        allowed = ", ".join(task.labels) if task.labels else f"0..{task.num_classes - 1}"
        raise DataError(f"task {task.name!r}: {where}: label {text!r} is not one of its classes ({allowed})")
    return int(value)


def _records(task: Task, path: Path, needed: list):
    """(line number, {column: text}) of a task file: JSON lines, or a delimited file, whose header
    must hold the ``needed`` columns (without one, ``header: false``, the columns are positions)."""
    what = f"task {task.name!r}:"  # open_text's messages: "task 'x': PATH not found"
    try:
        with open_text(path, what=what) as handle:
            if path.suffix.lower() in JSON_SUFFIXES:
                yield from _json_records(task, path, handle)
            else:
                yield from _delimited_records(task, path, handle, needed)
    except UnicodeDecodeError as error:  # a binary file, or another encoding
        raise not_text(path, error, what) from None
    except csv.Error as error:  # a NUL byte, a field over csv's size limit
        raise DataError(f"{what} {path}: not a delimited text file ({error})") from None


def _json_records(task: Task, path: Path, handle):
    for number, line in enumerate(handle, start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError:
                raise DataError(f"task {task.name!r}: {path} line {number}: not a JSON object") from None
            if not isinstance(record, dict):
                raise DataError(f"task {task.name!r}: {path} line {number}: not a JSON object")
            yield number, record


def _delimited_records(task: Task, path: Path, handle, needed: list):
    comma = path.suffix.lower() == ".csv"
    reader = csv.reader(handle, delimiter="," if comma else "\t", quoting=csv.QUOTE_MINIMAL if comma else csv.QUOTE_NONE)
    if task.header:
        header = next(reader, None)
        if header is None:
            raise DataError(f"task {task.name!r}: {path} is empty (expected a header line)")
        header = [h.strip() for h in header]
        missing = [c for c in needed if c not in header]
        if missing:
            raise DataError(f"task {task.name!r}: {path}: no column {missing[0]!r} in its header line (found: "
                            f"{', '.join(header)})" + (LOOKS_LIKE_DATA if any(map(_looks_like_data, header)) else ""))
    for fields in reader:
        if not fields:
            continue
        if task.header and len(fields) != len(header):
            raise DataError(f"task {task.name!r}: {path} line {reader.line_num}: expected {len(header)} fields, "
                            f"found {len(fields)}")
        if not task.header and len(fields) <= max(needed):
            raise DataError(f"task {task.name!r}: {path} line {reader.line_num}: no column {max(needed)} (found "
                            f"{len(fields)} fields; positions start at 0)")
        yield reader.line_num, dict(zip(header, fields)) if task.header else dict(enumerate(fields))


LOOKS_LIKE_DATA = ("; its first line looks like data, not column names: if the file has no header line, declare "
                   "header: false and give the columns by position (0 the first)")


def _looks_like_data(cell: str) -> bool:
    """A header cell that reads as a value: a number, or a sentence (column names are a word or two)."""
    try:
        float(cell)
        return True
    except ValueError:
        return len(cell.split()) > 2


def read_rows(task: Task, path, labeled: bool) -> tuple[list[str], list[tuple[str, ...]], list]:
    """(ids, texts per row, labels per row) of a declared task's file; ``labeled``: the label
    column must be there (train and dev files). Rows with a blank text are skipped with a warning."""
    path = Path(path)
    ids, texts, labels, blank = [], [], [], []
    labeled = labeled and task.labeled  # a pair-ranking task's rows are positive pairs, with no label column
    needed = list(task.text_columns) + ([task.label_column] if labeled else []) + \
        ([task.id_column] if task.id_column is not None else [])
    for number, record in _records(task, path, needed):
        missing = [c for c in needed if c not in record]
        if missing:
            raise DataError(f"task {task.name!r}: {path} line {number}: no column {missing[0]!r} "
                            f"(found: {', '.join(map(str, record))})")
        row = tuple(str(record[c]).strip() for c in task.text_columns)
        if not all(row):
            blank.append(number)
            continue
        has_label = task.label_column in record and str(record[task.label_column]).strip() != ""
        if not task.labeled:
            labels.append(1)  # a positive pair
        else:
            labels.append(_label(task, record[task.label_column], f"{path} line {number}") if has_label else None)
        ids.append(str(record[task.id_column]).strip() if task.id_column is not None else str(number))
        texts.append(row)
    if blank:
        logger.warning("warning: task %r: %s: skipped %d row(s) with a blank text", task.name, path, len(blank))
    if labeled and not any(label is not None for label in labels):
        raise DataError(f"task {task.name!r}: {path} has no labeled rows")
    return ids, texts, labels


def _builtin_rows(task: Task, split: str, path: Path, limit: int | None):
    """The CS224N reader's rows, as :func:`load_task` expects them: train, the labeled rows (the
    first ``limit``); dev, every row with the labels of the labeled ones; test, every row."""
    reader = READERS[task.reader]
    if split == "train":
        rows = reader(path, labeled=True)[:limit]
        labels = [r.label for r in rows]
    elif split == "dev":  # one read: a row without a label is kept, for its prediction
        rows = reader(path, labeled=True, keep_unlabeled=True)
        labels = [r.label for r in rows]
    else:
        rows = reader(path, labeled=False)
        labels = [None] * len(rows)
    if task.reader == "sst":
        labels = [None if label is None else int(label) for label in labels]
        texts = [(r.sentence,) for r in rows]
    else:
        texts = [(r.sentence1, r.sentence2) for r in rows]
    # The reader knows the file's labels, the declaration what they mean: a task file may have
    # changed its classes or label_range, so each label is checked against them as any task's is.
    labels = [None if label is None else _label(task, label, f"{path} id {r.id}") for r, label in zip(rows, labels)]
    return [r.id for r in rows], texts, labels


def tokenize_column(tokenizer, sentences, max_length: int) -> list[list[int]]:
    return tokenizer(list(sentences), truncation=True, max_length=max_length,
                     return_attention_mask=False, return_token_type_ids=False)["input_ids"]


def load_task(task: Task, split: str, tokenizer, max_length: int, limit: int | None = None,
              joint: bool = False, path=None) -> TaskData:
    """Read and tokenise one file of ``task`` (``path``, default the declared one). train: labeled
    rows (the first ``limit``); dev: every row, with the labels of the labeled ones (every id gets
    a prediction); test: every row. ``joint``: a pair task's two sentences tokenised together (the
    tokenizer's pair encoding, at most ``max_length`` tokens in all, the longer sentence cut first)."""
    path = Path(path or task.file(split))
    if task.reader:
        ids, texts, labels = _builtin_rows(task, split, path, limit)
    else:
        ids, texts, labels = read_rows(task, path, labeled=split != "test")
        if split == "train":
            keep = [i for i, label in enumerate(labels) if label is not None][:limit]
            ids, texts, labels = [ids[i] for i in keep], [texts[i] for i in keep], [labels[i] for i in keep]
        elif split == "test":
            labels = [None] * len(ids)
    if split == "train" and not ids:
        raise DataError(f"task {task.name!r}: {path} has no training rows")
    if split != "train":
        check_unique_ids(task, path, ids)
    text_columns = list(zip(*texts)) if texts else [[] for _ in task.text_columns]
    if joint:
        token_ids, types = tokenize_pairs(tokenizer, text_columns[0], text_columns[1], max_length)
        return TaskData(task, ids, (token_ids,), labels, types)
    tokens = tuple(tokenize_column(tokenizer, column, max_length) for column in text_columns)
    return TaskData(task, ids, tokens, labels)


def check_unique_ids(task: Task, path: Path, ids: list[str]) -> None:
    """DataError for an id that two rows share: a prediction file, and the comparison of runs,
    key the rows by id, so one of the two would be lost."""
    seen = set()
    for i in ids:
        if i in seen:
            column = f"column {task.id_column!r}" if task.id_column is not None else "its id column"
            raise DataError(f"task {task.name!r}: {path}: id {i!r} appears on more than one row ({column}); "
                            f"each row's id must be its own")
        seen.add(i)


# ---- a run's data ----------------------------------------------------------------------------------
def check_files(tasks: list[Task], splits=SPLITS, why: str | None = None) -> None:
    """DataError for a missing train or dev file among ``splits`` (``why``: why it was not
    downloaded, for the error line)."""
    for task in tasks:
        for split in splits:
            path = task.file(split)
            if path is not None and Path(path).is_dir():
                raise DataError(f"task {task.name!r}: {split} file {path} is a directory, not a file")
            if split != "test" and not Path(path).is_file():
                because = f"; {why}" if why else ""
                if task.reader:  # a built-in task: its flags say where
                    raise DataError(f"{path} not found (set --data-dir or --{task.name}-{split}{because})")
                raise DataError(f"task {task.name!r}: {split} file {path} not found{because}")


def fetch_data(tasks: list[Task], data_dir) -> str | None:
    """When a built-in task's train or dev file is missing from --data-dir, download the missing
    CS224N files, the test files too (for the predictions); returns why that failed, or None."""
    missing = {}
    for task in (t for t in tasks if t.reader):
        for split in SPLITS:
            standard = Path(data_dir) / TASK_FILES[task.reader, split]
            if Path(task.file(split)) == standard and not standard.is_file():  # no flag points elsewhere
                missing[standard] = split
    if all(split == "test" for split in missing.values()):
        return None
    return fetch_missing(data_dir, [path.name for path in missing])


def load_data(tasks: list[Task], tokenizer, max_length: int, splits=SPLITS, joint=(),
              max_train_examples: int | None = None) -> dict:
    """(task name, split) -> TaskData, or None for an absent or undeclared test file (skipped with
    a warning); ``joint``: the names of the tasks whose pairs are tokenised together (their heads
    read a pair jointly: ``TaskHead.joint``). Train and dev files must exist (DataError otherwise),
    checked before anything is read."""
    check_files(tasks, splits)
    data = {}
    for task in tasks:
        for split in splits:
            path = task.file(split)
            if split == "test" and path is None:
                data[task.name, split] = None  # declared without one
                continue
            if split == "test" and not Path(path).exists():
                logger.warning("warning: %s not found: no %s test predictions", path, task.name)
                data[task.name, split] = None
                continue
            limit = max_train_examples if split == "train" else None
            data[task.name, split] = load_task(task, split, tokenizer, max_length, limit, task.name in joint)
    return data
