"""The CS224N task files and text corpora: readers (the downloader is ``bertcf.data.download``).

Task files (CS224N default final project, see ``data/README.md``) are tab-separated with a
header row whose first column is an unnamed pandas index.  Columns are always selected by
header name, because ``ids-sst-test-student.csv`` has a shifted header.  Fields are parsed
with a real CSV parser (Quora questions are quoted with doubled inner quotes).

Every bad-input case raises :class:`DataError` with one line naming the file and, where it
applies, the line number, e.g. ``data/sts-train.csv line 17: similarity 'abc' is not a
number``.  Rows that are skipped rather than rejected (blank sentences, empty labels) are
reported in one warning per file on the ``bertcf.data`` logger.

"""

from __future__ import annotations

import csv
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from .reading import open_text

logger = logging.getLogger("bertcf.data")

__all__ = [
    "SentenceExample", "PairExample", "TASKS", "SPLITS", "TASK_FILES", "task_file",
    "read_sst", "read_qqp", "read_sts", "READERS", "read_task", "read_corpus", "task_sentences",
]


@dataclass
class SentenceExample:
    """One SST sentence; ``label`` is the sentiment 0..4, or None for unlabeled files."""

    id: str
    sentence: str
    label: int | None


@dataclass
class PairExample:
    """One sentence pair (QQP or STS); ``label`` is 0.0/1.0 (QQP), 0..5 (STS) or None."""

    id: str
    sentence1: str
    sentence2: str
    label: float | None


# --------------------------------------------------------------------------------------
# Standard file names
# --------------------------------------------------------------------------------------

TASKS = ("sst", "qqp", "sts")  # QQP's files keep CS224N's "quora" names
SPLITS = ("train", "dev", "test")

TASK_FILES: dict[tuple[str, str], str] = {
    ("sst", "train"): "ids-sst-train.csv",
    ("sst", "dev"): "ids-sst-dev.csv",
    ("sst", "test"): "ids-sst-test-student.csv",
    ("qqp", "train"): "quora-train.csv",
    ("qqp", "dev"): "quora-dev.csv",
    ("qqp", "test"): "quora-test-student.csv",
    ("sts", "train"): "sts-train.csv",
    ("sts", "dev"): "sts-dev.csv",
    ("sts", "test"): "sts-test-student.csv",
}


def task_file(data_dir: str | os.PathLike, task: str, split: str) -> Path:
    """Path of the standard file for ``task`` ('sst', 'qqp', 'sts') and ``split``
    ('train', 'dev', 'test') in ``data_dir``.  Raises ValueError for unknown names."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} (expected one of {', '.join(TASKS)})")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    return Path(data_dir) / TASK_FILES[task, split]


# --------------------------------------------------------------------------------------
# Label parsers: return the value or raise ValueError with the message after "line N: "
# --------------------------------------------------------------------------------------

def _parse_number(column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{column} {text!r} is not a number") from None
    return value


def _parse_sentiment(text: str) -> int:
    value = _parse_number("sentiment", text)
    if not (math.isfinite(value) and value == int(value)):
        raise ValueError(f"sentiment {text!r} is not an integer")
    if not 0 <= value <= 4:
        raise ValueError(f"sentiment {text!r} is out of range (0 to 4)")
    return int(value)


def _parse_duplicate(text: str) -> float:
    value = _parse_number("is_duplicate", text)
    if value not in (0.0, 1.0):
        raise ValueError(f"is_duplicate {text!r} is not 0 or 1")
    return value


def _parse_similarity(text: str) -> float:
    value = _parse_number("similarity", text)
    if not 0.0 <= value <= 5.0:  # also rejects nan
        raise ValueError(f"similarity {text!r} is out of range (0 to 5)")
    return value


# --------------------------------------------------------------------------------------
# Generic table reader
# --------------------------------------------------------------------------------------

def _not_found_hint(data_dir: Path) -> str:
    return f"see data/README.md, or run: python -m bertcf.data download --out {data_dir}"


def _line_list(lines: list[int], limit: int = 5) -> str:
    shown = ", ".join(str(n) for n in lines[:limit])
    more = ", ..." if len(lines) > limit else ""
    return f"line{'s' if len(lines) > 1 else ''} {shown}{more}"


def _header_columns(header: list[str], where: str, text_columns: tuple[str, ...], label_column: str,
                    labeled: bool | None) -> tuple[dict[str, int], bool]:
    """({column name: index}, whether the rows are labeled) of a CS224N header line; a missing
    column is a DataError naming ``where`` (the file and line)."""
    names = [name.strip() for name in header]
    columns: dict[str, int] = {}
    for index, name in enumerate(names):
        columns.setdefault(name, index)
    found = ", ".join(repr(name) for name in names)
    missing = [name for name in ("id", *text_columns) if name not in columns]
    if missing:
        listed = ", ".join(repr(name) for name in missing)
        raise DataError(f"{where}: missing column {listed} (found columns: {found})")
    if labeled is None:
        labeled = label_column in columns
    elif labeled and label_column not in columns:
        raise DataError(f"{where}: missing label column {label_column!r} (found columns: {found})")
    return columns, labeled


def _read_table(
    path: str | os.PathLike,
    text_columns: tuple[str, ...],
    label_column: str,
    parse_label: Callable[[str], float | int],
    labeled: bool | None,
    keep_unlabeled: bool = False,
) -> list[tuple[str, list[str], float | int | None]]:
    """Read a CS224N task file into ``(id, [texts], label)`` tuples.

    Columns are looked up by header name.  Texts are stripped of surrounding whitespace.
    Rows with a blank text or an empty label are skipped and reported in one warning;
    ``keep_unlabeled``: a row with an empty label is kept, its label None (a dev set's predictions).
    """
    path = Path(path)
    with open_text(path, hint=_not_found_hint(path.parent)) as handle:
        reader = csv.reader(handle, delimiter="\t")
        try:
            header = next(reader, None)
            if header is None:
                raise DataError(f"{path} is empty (expected a header line)")
            columns, labeled = _header_columns(header, f"{path} line {reader.line_num}", text_columns,
                                               label_column, labeled)

            rows: list[tuple[str, list[str], float | int | None]] = []
            blank: dict[str, list[int]] = {}
            no_label: list[int] = []
            total = 0
            last_line = reader.line_num
            for fields in reader:
                line, last_line = last_line + 1, reader.line_num
                if not fields:  # an empty line
                    continue
                total += 1
                if len(fields) != len(header):
                    raise DataError(f"{path} line {line}: expected {len(header)} tab-separated "
                                    f"fields, found {len(fields)}")
                example_id = fields[columns["id"]].strip()
                if not example_id:
                    raise DataError(f"{path} line {line}: empty id")
                label = None
                if labeled:
                    label_text = fields[columns[label_column]].strip()
                    if not label_text and not keep_unlabeled:
                        no_label.append(line)
                        continue
                    try:
                        label = parse_label(label_text) if label_text else None
                    except ValueError as error:
                        raise DataError(f"{path} line {line}: {error}") from None
                texts = [fields[columns[name]].strip() for name in text_columns]
                empty = [name for name, text in zip(text_columns, texts) if not text]
                if empty:
                    blank.setdefault(empty[0], []).append(line)
                    continue
                rows.append((example_id, texts, label))
        except csv.Error as error:
            raise DataError(f"{path} line {reader.line_num}: malformed CSV ({error})") from None
        except UnicodeDecodeError:
            raise DataError(
                f"{path}: not valid UTF-8 text (after line {reader.line_num})") from None

    skipped = [f"{len(lines)} with an empty {label_column} ({_line_list(lines)})"
               for lines in [no_label] if lines]
    skipped += [f"{len(lines)} with a blank {name} ({_line_list(lines)})"
                for name, lines in blank.items()]
    if skipped:
        count = len(no_label) + sum(len(lines) for lines in blank.values())
        logger.warning("%s: skipped %d of %d rows: %s", path, count, total, "; ".join(skipped))
    if not rows:
        raise DataError(f"{path} has no usable rows" + (f" (of {total})" if total else ""))
    return rows


def read_sst(path: str | os.PathLike, labeled: bool | None = None, keep_unlabeled: bool = False
             ) -> list[SentenceExample]:
    """Read an SST file (columns id, sentence[, sentiment]); labels are ints 0..4.

    ``labeled=None``: labeled iff the file has a ``sentiment`` column; ``True``: the column
    is required; ``False``: any label column is ignored.  Sentences are stripped (the SST
    files start every sentence with a space); they stay PTB-tokenized (``-LRB-``, `` 's``).
    ``keep_unlabeled`` (every reader): a row with an empty label is kept, its label None, not skipped.
    """
    rows = _read_table(path, ("sentence",), "sentiment", _parse_sentiment, labeled, keep_unlabeled)
    return [SentenceExample(id_, texts[0], label) for id_, texts, label in rows]


def read_qqp(path: str | os.PathLike, labeled: bool | None = None, keep_unlabeled: bool = False
             ) -> list[PairExample]:
    """Read a Quora Question Pairs file (id, sentence1, sentence2[, is_duplicate]).

    Labels are 0.0 / 1.0 ("0", "1", "0.0" and "1.0" are accepted).  Rows with an empty
    ``is_duplicate`` (two in the original quora-dev.csv) are skipped with a warning.
    """
    rows = _read_table(path, ("sentence1", "sentence2"), "is_duplicate", _parse_duplicate, labeled, keep_unlabeled)
    return [PairExample(id_, s1, s2, label) for id_, (s1, s2), label in rows]


def read_sts(path: str | os.PathLike, labeled: bool | None = None, keep_unlabeled: bool = False
             ) -> list[PairExample]:
    """Read an STS file (id, sentence1, sentence2[, similarity]); labels are floats in [0, 5]."""
    rows = _read_table(path, ("sentence1", "sentence2"), "similarity", _parse_similarity, labeled, keep_unlabeled)
    return [PairExample(id_, s1, s2, label) for id_, (s1, s2), label in rows]


READERS = {"sst": read_sst, "qqp": read_qqp, "sts": read_sts}


def read_task(data_dir: str | os.PathLike, task: str, split: str,
              labeled: bool | None = None) -> list[SentenceExample] | list[PairExample]:
    """Read the standard file of ``task``/``split`` in ``data_dir`` (see :func:`task_file`)."""
    return READERS[task](task_file(data_dir, task, split), labeled=labeled)


# --------------------------------------------------------------------------------------
# Plain-text corpora
# --------------------------------------------------------------------------------------

def read_corpus(path: str | os.PathLike, min_words: int = 6) -> list[str]:
    """Read a plain-text corpus with one sentence per line (e.g. Wiki1M).

    Lines are stripped; blank lines are skipped (reported in one warning); sentences with
    fewer than ``min_words`` whitespace-separated words are dropped (the report drops
    sentences of 5 words or fewer, hence the default 6; ``min_words=0`` keeps all).
    """
    if min_words < 0:
        raise ValueError(f"min_words must be >= 0, got {min_words}")
    path = Path(path)
    sentences: list[str] = []
    blank = short = line_no = 0
    with open_text(path, "corpus", newline="\n") as handle:  # split on \n only
        try:
            for line_no, line in enumerate(handle, start=1):
                sentence = line.strip()
                if not sentence:
                    blank += 1
                elif len(sentence.split()) < min_words:
                    short += 1
                else:
                    sentences.append(sentence)
        except UnicodeDecodeError:
            raise DataError(f"corpus {path} is not valid UTF-8 text "
                            f"(after line {line_no})") from None

    summary = f"corpus {path}: kept {len(sentences)} sentences"
    if short:
        summary += f", dropped {short} with fewer than {min_words} words"
    if blank:
        logger.warning("%s, skipped %d blank lines", summary, blank)
    else:
        logger.info("%s", summary)
    if not sentences:
        if short:
            raise DataError(f"corpus {path} has no sentences with at least {min_words} words")
        raise DataError(f"corpus {path} is empty")
    return sentences


def task_sentences(data_dir: str | os.PathLike, min_words: int = 0) -> list[str]:
    """The unlabeled sentences of the SST, QQP and STS *train* files in ``data_dir``.

    Used as a pretraining corpus (``--corpus-from-tasks``).  Sentences are stripped,
    deduplicated keeping the first occurrence (SST, then QQP, then STS; sentence1 before
    sentence2), and those with fewer than ``min_words`` words are dropped.
    """
    paths = {task: task_file(data_dir, task, "train") for task in TASKS}
    missing = [path.name for path in paths.values() if not path.is_file()]
    if missing:
        raise DataError(f"{data_dir}: missing task train file(s) {', '.join(missing)} "
                        f"needed for the task corpus ({_not_found_hint(Path(data_dir))})")
    sentences: list[str] = [ex.sentence for ex in read_sst(paths["sst"], labeled=False)]
    for reader, path in ((read_qqp, paths["qqp"]), (read_sts, paths["sts"])):
        for pair in reader(path, labeled=False):
            sentences += (pair.sentence1, pair.sentence2)
    unique = [s for s in dict.fromkeys(sentences) if len(s.split()) >= min_words]
    if not unique:
        raise DataError(f"{data_dir}: the task train files have no sentences with at least "
                        f"{min_words} words")
    return unique


