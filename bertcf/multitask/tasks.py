"""Tasks as data: what stage 3 trains on, declared by a name and a kind (as MT-DNN's task-definition
files and jiant's task configs declare theirs), with its files, columns, classes, loss, dev metric,
weight and batch size.

The kinds (each served by a head, ``bertcf.multitask.heads``):

- ``classification``: one sentence, ``num_classes`` classes (SST-5); head dropout + linear D x C,
  cross-entropy; metric accuracy.
- ``pair-classification``: two sentences, ``num_classes`` classes. Loss ``cosine-hinge`` (the
  report's QQP: two classes, y = max(cos(p1, p2), h) on projections of each sentence) or
  ``softmax`` (SBERT's classifier on (u, v, |u - v|), any number of classes; Reimers & Gurevych
  2019). Metric accuracy.
- ``pair-regression``: two sentences and a score in ``label_range``. Loss ``cosine-mse`` (the
  report's STS: the clamped cosine of projections regressed on the score scaled to [h, 1]).
  Metric Pearson r (or Spearman).
- ``regression``: one sentence and a score in ``label_range``. Loss ``mse``: a linear D x 1 head's
  score regressed on the score scaled to [0, 1] (sentence-transformers' MSELoss on a one-wide
  output). Metric Pearson r (or Spearman).
- ``pair-ranking``: two sentences that belong together (a question and its paraphrase, a query and
  its answer), no label column. Loss ``multiple-negatives-ranking``: each pair's second sentence
  against the batch's other second sentences, cross-entropy of 20 x cosine (sentence-transformers'
  MultipleNegativesRankingLoss; Henderson et al. 2017). Metric ``mrr``: over the dev pairs, each
  first sentence ranks every dev second sentence by cosine; the mean reciprocal rank of its own.

With ``--pair-encoding cross`` the pair tasks read both sentences together instead, whatever
their loss: a logit (two classes, binary cross-entropy), logits (more classes, cross-entropy) or a
score (squared error) from a linear head on BERT's pooled [CLS].

SST, QQP and STS are the built-in declarations (:func:`builtin_tasks`), read from the CS224N files
with their own readers and written as the CS224N prediction files. Other tasks are read from any
delimited file with a header (``.tsv``: tab-separated, no quoting, as SNLI's files; ``.csv``:
comma-separated with CSV quoting) or JSON lines, their columns named in the declaration. A task
file (YAML or JSON) holds a list of declarations, or ``{"tasks": [...]}``; ``--task`` gives one as
``name=snli,kind=pair-classification,train=FILE,...``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from ..data.tasks import TASK_FILES
from ..errors import UsageError

KINDS = ("classification", "pair-classification", "pair-regression", "regression", "pair-ranking")
#: The kinds whose rows are two sentences.
PAIR_KINDS = ("pair-classification", "pair-regression", "pair-ranking")
#: The kinds whose labels are scores in ``label_range`` (the others': classes).
SCORE_KINDS = ("pair-regression", "regression")
#: The kinds whose rows carry no label: each row is a positive pair (its label is 1).
UNLABELED_KINDS = ("pair-ranking",)
#: The losses each kind takes; the first is its default.
LOSSES = {"classification": ("cross-entropy",), "pair-classification": ("cosine-hinge", "softmax"),
          "pair-regression": ("cosine-mse",), "regression": ("mse",),
          "pair-ranking": ("multiple-negatives-ranking",)}
#: The dev metrics each kind takes; the first is its default.
METRICS = {"classification": ("accuracy",), "pair-classification": ("accuracy",),
           "pair-regression": ("pearson", "spearman"), "regression": ("pearson", "spearman"), "pair-ranking": ("mrr",)}
#: A metric's short name in metrics.json / TensorBoard: sst_acc, qqp_acc, sts_pearson, snli_acc.
METRIC_KEYS = {"accuracy": "acc", "pearson": "pearson", "spearman": "spearman", "mrr": "mrr"}
BUILTIN = ("sst", "qqp", "sts")
SPLITS = ("train", "dev", "test")
NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
JSON_SUFFIXES = (".jsonl", ".json")  # a task's file of JSON lines; any other suffix is delimited
#: The columns each built-in task's CS224N reader reads (a declaration cannot change them).
READER_COLUMNS = {"sst": {}, "qqp": {"text_columns": ("sentence1", "sentence2"), "label_column": "is_duplicate"},
                  "sts": {"text_columns": ("sentence1", "sentence2"), "label_column": "similarity"}}


@dataclass(frozen=True)
class Task:
    """One task of stage 3 (see the module docstring for the kinds, losses and metrics).

    ``train``/``dev``/``test``: its files (test optional: no test predictions without one);
    ``text_columns``: the one or two columns holding the sentences; ``label_column``; ``id_column``
    (None: the row's line number); ``num_classes`` (classification kinds); ``labels``: the class
    names as they appear in the files, in class order (default: the labels are the integers
    0..C-1); ``label_range`` (regression): the scores' range, scaled to [h, 1] for the loss;
    ``weight``: its loss's weight in the step's sum; ``batch_size``: examples of it per step;
    ``dropout`` before its head; ``margin``: h of the cosine losses; ``header``: whether a delimited
    file's first line names its columns (False: every line is data, and the columns are named by
    position, 0 the first); ``reader``: the CS224N reader of a built-in task (None for any other
    file)."""

    name: str
    kind: str
    train: str | None = None
    dev: str | None = None
    test: str | None = None
    text_columns: tuple[str, ...] = ("sentence",)
    label_column: str = "label"
    id_column: str | None = None
    num_classes: int | None = None
    labels: tuple[str, ...] | None = None
    label_range: tuple[float, float] = (0.0, 5.0)
    loss: str | None = None
    metric: str | None = None
    weight: float = 1.0
    batch_size: int = 32
    dropout: float = 0.1
    margin: float = 0.0
    header: bool = True
    reader: str | None = None

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        check_types(self)  # before the conversions below, which would fail on a wrong type with no task named
        for split in SPLITS:
            if isinstance(getattr(self, split), PathLike):
                set_(split, str(getattr(self, split)))
        if isinstance(self.text_columns, (str, int)):  # one column, as a task file may say it
            set_("text_columns", (self.text_columns,))
        set_("text_columns", tuple(self.text_columns))
        if self.labels is not None:
            set_("labels", tuple(str(label) for label in self.labels))
        set_("label_range", tuple(float(v) for v in self.label_range))
        if self.kind in KINDS:
            set_("loss", self.loss or LOSSES[self.kind][0])
            set_("metric", self.metric or METRICS[self.kind][0])
            if self.num_classes is None and self.labels is not None:
                set_("num_classes", len(self.labels))
        check(self)

    @property
    def pair(self) -> bool:
        """Two sentences a row."""
        return self.kind in PAIR_KINDS

    @property
    def regression(self) -> bool:
        """Its labels are scores in ``label_range``."""
        return self.kind in SCORE_KINDS

    @property
    def labeled(self) -> bool:
        """Its files have a label column (a pair-ranking task's rows are positive pairs)."""
        return self.kind not in UNLABELED_KINDS

    @property
    def classes(self) -> bool:
        """Its predictions are classes (else numbers: a score, a reciprocal rank)."""
        return self.labeled and not self.regression

    @property
    def metric_key(self) -> str:
        """Its dev metric's name in metrics.json, e.g. sst_acc, sts_pearson."""
        return f"{self.name}_{METRIC_KEYS[self.metric]}"

    def file(self, split: str) -> str | None:
        return {"train": self.train, "dev": self.dev, "test": self.test}[split]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"text_columns": list(self.text_columns),
                                           "labels": None if self.labels is None else list(self.labels),
                                           "label_range": list(self.label_range)}

    def replace(self, **changes) -> "Task":
        return dataclasses.replace(self, **changes)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # YAML's yes/no are not numbers


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _column(value) -> bool:
    """A column's name, or its position (0 the first) in a file without a header."""
    return (isinstance(value, str) and value != "") or (_integer(value) and value >= 0)


def check_types(task: Task) -> None:
    """UsageError, naming the task and the field, for a value of the wrong type: what a task file
    or a keyword can get wrong (a word where a number belongs, one number where a list does)."""
    def bad(field, what):
        raise UsageError(f"task {task.name!r}: {field} must be {what}, not {getattr(task, field)!r}")
    if not isinstance(task.name, str) or not NAME.match(task.name):
        raise UsageError(f"task name {task.name!r}: use lowercase letters, digits and _ (starting with a letter)")
    for field in ("kind", "loss", "metric", *SPLITS):
        value = getattr(task, field)
        if value is not None and not isinstance(value, (str, PathLike) if field in SPLITS else str):
            bad(field, "a file's path" if field in SPLITS else "a word")
    columns = task.text_columns
    if not (_column(columns) or isinstance(columns, (list, tuple)) and columns and all(map(_column, columns))):
        bad("text_columns", "a list of column names (or positions, with header: false)")
    for field in ("label_column", "id_column"):
        if not (_column(getattr(task, field)) or field == "id_column" and task.id_column is None):
            bad(field, "a column's name (or position, with header: false)")
    if task.labels is not None and not (isinstance(task.labels, (list, tuple))
                                        and all(isinstance(x, str) or _integer(x) for x in task.labels)):
        bad("labels", "a list of the class names")
    if not (isinstance(task.label_range, (list, tuple)) and len(task.label_range) == 2
            and all(map(_number, task.label_range))):
        bad("label_range", "two numbers [low, high]")
    for field in ("weight", "dropout", "margin"):
        if not _number(getattr(task, field)):
            bad(field, "a number")
    for field in ("batch_size", "num_classes"):
        if getattr(task, field) is not None and not _integer(getattr(task, field)):
            bad(field, "an integer")
    if not isinstance(task.header, bool):
        bad("header", "true or false")


def check(task: Task) -> None:
    """UsageError, one line naming the task and the problem, for a declaration that cannot run."""
    def bad(problem):
        raise UsageError(f"task {task.name!r}: {problem}")
    if task.kind not in KINDS:
        bad(f"unknown kind {task.kind!r} (kinds: {', '.join(KINDS)})")
    if task.loss not in LOSSES[task.kind]:
        bad(f"loss {task.loss!r} is not one of a {task.kind} task's ({', '.join(LOSSES[task.kind])})")
    if task.metric not in METRICS[task.kind]:
        bad(f"metric {task.metric!r} is not one of a {task.kind} task's ({', '.join(METRICS[task.kind])})")
    if len(task.text_columns) != (2 if task.pair else 1):
        bad(f"a {task.kind} task reads {2 if task.pair else 1} text column(s), not {list(task.text_columns)}")
    if task.classes:
        if not isinstance(task.num_classes, int) or task.num_classes < 2:
            bad(f"num_classes must be an integer of at least 2, not {task.num_classes!r}")
        if task.labels is not None and (len(task.labels) != task.num_classes or len(set(task.labels)) != len(task.labels)):
            bad(f"labels must name each of the {task.num_classes} classes once, not {list(task.labels)}")
        if task.loss == "cosine-hinge" and task.num_classes != 2:
            bad(f"the cosine-hinge loss has two classes, not {task.num_classes} (use loss softmax)")
    elif task.regression:
        lo, hi = task.label_range
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            bad(f"label_range must be two finite numbers, low < high, not {list(task.label_range)}")
    if not (isinstance(task.weight, (int, float)) and math.isfinite(task.weight) and task.weight >= 0):
        bad(f"weight must be a number >= 0, not {task.weight!r}")
    if not isinstance(task.batch_size, int) or task.batch_size < 1:
        bad(f"batch_size must be an integer of at least 1, not {task.batch_size!r}")
    if not 0 <= task.dropout < 1:
        bad(f"dropout must be in [0, 1), not {task.dropout!r}")
    if not -1 <= task.margin < 1:
        bad(f"margin must be in [-1, 1), not {task.margin!r}")
    if task.reader is None and task.train is None:
        bad("no train file")
    if task.reader is None and task.dev is None:
        bad("no dev file")
    if task.reader is not None and task.reader not in READER_COLUMNS:
        bad(f"reader {task.reader!r} is not a built-in task's ({', '.join(READER_COLUMNS)})")
    if task.reader is not None:
        given = {"text_columns": task.text_columns, "label_column": task.label_column, "id_column": task.id_column,
                 "header": task.header}
        for field, value in given.items():
            if value != READER_COLUMNS[task.reader].get(field, DEFAULTS[field]):
                value = list(value) if isinstance(value, tuple) else value
                bad(f"{field} {value!r} does not apply: the built-in {task.reader} task reads the CS224N "
                    f"file's own columns (declare a task with another name to read other columns)")
        return
    columns = [*task.text_columns, task.label_column, *([] if task.id_column is None else [task.id_column])]
    positions = [c for c in columns if isinstance(c, int)]
    if task.header and positions:
        bad(f"column {positions[0]} is a position: name the columns by position only with header: false "
            f"(then every line is data)")
    if not task.header and len(positions) != len(columns):
        named = next(c for c in columns if not isinstance(c, int))
        bad(f"header: false, so the file's columns have no names: give column {named!r} by position (0 the first)")
    jsonl = [p for p in (task.train, task.dev, task.test) if p and Path(p).suffix.lower() in JSON_SUFFIXES]
    if not task.header and jsonl:
        bad(f"header: false is for delimited files; {jsonl[0]} holds JSON objects, whose fields have names")


#: The report's settings of the built-in tasks (section 4.3), the defaults of their flags.
REPORT = {"sst_weight": 5.0, "qqp_weight": 20.0, "sts_weight": 1.0,
          "sst_batch_size": 32, "qqp_batch_size": 96, "sts_batch_size": 32,
          "sst_dropout": 0.3, "qqp_dropout": 0.0, "sts_dropout": 0.1, "qqp_margin": 0.7, "sts_margin": 0.0}


def builtin_tasks(data_dir="data", files: dict | None = None, **settings) -> dict[str, Task]:
    """SST, QQP and STS with the report's settings (:data:`REPORT`; ``settings`` override them by
    the same names, e.g. ``qqp_weight=10``), their files ``files[task, split]`` or the standard
    CS224N names in ``data_dir``."""
    unknown = sorted(set(settings) - set(REPORT))
    if unknown:
        raise UsageError(f"builtin_tasks: unknown setting {unknown[0]!r} (settings: {', '.join(REPORT)})")
    s = REPORT | settings
    files = files or {}

    def paths(task):
        return {split: str(files.get((task, split)) or Path(data_dir) / TASK_FILES[task, split]) for split in SPLITS}
    return {
        "sst": Task("sst", "classification", **paths("sst"), num_classes=5, weight=s["sst_weight"],
                    batch_size=s["sst_batch_size"], dropout=s["sst_dropout"], reader="sst"),
        "qqp": Task("qqp", "pair-classification", **paths("qqp"), **READER_COLUMNS["qqp"], num_classes=2,
                    loss="cosine-hinge", weight=s["qqp_weight"], batch_size=s["qqp_batch_size"],
                    dropout=s["qqp_dropout"], margin=s["qqp_margin"], reader="qqp"),
        "sts": Task("sts", "pair-regression", **paths("sts"), **READER_COLUMNS["sts"], weight=s["sts_weight"],
                    batch_size=s["sts_batch_size"], dropout=s["sts_dropout"], margin=s["sts_margin"], reader="sts"),
    }


#: Each Task field's default (what a declaration that leaves the field out gets).
DEFAULTS = {f.name: f.default for f in dataclasses.fields(Task) if f.default is not dataclasses.MISSING}
