"""The training files of the supervised objectives (``run_pretrain.py --stage supervised
--train-file FILE ...``): labelled sentence pairs, whatever their format, and parallel text.

- ``read_pairs``: an NLI file (``bertcf.data.nli``: SNLI/MultiNLI ``.jsonl`` or ``.txt``, or a
  ``premise<TAB>hypothesis<TAB>label`` TSV), or a CS224N QQP or STS file (``bertcf.data.tasks``:
  header ``id, sentence1, sentence2, is_duplicate`` or ``similarity``), told apart by the
  extension and the header;
- ``read_parallel``: ``source<TAB>target`` lines (a sentence and its translation), or one
  sentence per line (then the target is the source), for distillation.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError
from .negatives import MARGIN_HEADER, PAIR_HEADERS, TRIPLET_HEADER
from .nli import LABELS, read_nli
from .reading import not_text, open_text
from .tasks import read_qqp, read_sts

#: What a kind of pair file's labels are: NLI's three classes, QQP's two, STS's graded 0-5.
CLASSES = {"nli": LABELS, "qqp": ("not duplicate", "duplicate"), "sts": ()}
#: What a graded kind's labels are divided by to give a target in [0, 1] (QQP's 0/1 as they are).
SCALE = {"sts": 5.0, "qqp": 1.0}
FORMATS = ("SNLI/MultiNLI .jsonl, their .txt release (header with gold_label), a premise<TAB>hypothesis<TAB>label "
           "TSV, or a CS224N QQP/STS file (header id, sentence1, sentence2, is_duplicate or similarity)")
#: The files of the contrastive and distilled methods, not labelled pairs: kind -> (what, the method that reads them).
UNLABELLED = {"triplets": ("(anchor, positive, negative) triplets", "simcse-sup"),
              "pairs": ("(query, positive) pairs", "simcse-sup"),
              "beir": ("a set in BEIR's layout, (query, relevant document) pairs", "simcse-sup"),
              "margins": ("(query, positive, negative) rows with margins", "margin-mse")}


@dataclass
class LabelledPairs:
    """Sentence pairs with a label each: ``kind`` nli (label 0-2, ``nli.LABELS``), qqp (0 or 1) or
    sts (a similarity in [0, 5]); ``sources``: the files read."""
    kind: str
    sentence1: list[str] = field(default_factory=list)
    sentence2: list[str] = field(default_factory=list)
    labels: list[float] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    @property
    def classes(self) -> tuple[str, ...]:
        return CLASSES[self.kind]

    def __len__(self) -> int:
        return len(self.labels)


def pair_kind(path: Path) -> str:
    """nli, qqp, sts, triplets (anchor, positive, negative), margins (query, positive, negative,
    margin), pairs (query, positive) or beir (a directory in BEIR's layout with qrels/train.tsv): by
    the extension (.jsonl is NLI), the header line, or a directory."""
    if path.is_dir():
        if not (path / "qrels" / "train.tsv").is_file():
            raise DataError(f"{path} is a directory: a set in BEIR's layout trains on its qrels/train.tsv, which it "
                            f"lacks (python -m bertcf.data genq writes one)")
        return "beir"
    if path.suffix == ".jsonl":
        return "nli"
    with open_text(path, "training file", newline="\n") as handle:
        try:
            header = [h.strip() for h in handle.readline().rstrip("\r\n").split("\t")]
        except UnicodeDecodeError as error:
            raise not_text(path, error, "training file") from None
    if "gold_label" in header or header == ["premise", "hypothesis", "label"]:
        return "nli"
    if tuple(header) == TRIPLET_HEADER:  # mined hard negatives (bertcf.data.negatives)
        return "triplets"
    if tuple(header) == MARGIN_HEADER:  # GPL's cross-encoder margins
        return "margins"
    if tuple(header) in PAIR_HEADERS:
        return "pairs"
    if {"sentence1", "sentence2"} <= set(header):
        for kind, label in (("qqp", "is_duplicate"), ("sts", "similarity")):
            if label in header:
                return kind
    shown = ", ".join(header) if any(header) else "an empty line"
    raise DataError(f"{path} line 1: not a labelled-pair file (found {shown}); expected {FORMATS}")


def read_pairs(paths) -> LabelledPairs:
    """The labelled pairs of one or more files of one kind, in order (files of different kinds:
    a DataError naming them)."""
    paths = [Path(p) for p in paths]
    kinds = {p: pair_kind(p) for p in paths}
    if len(set(kinds.values())) > 1:
        raise DataError("the training files are of different kinds: "
                        + ", ".join(f"{p} ({k})" for p, k in kinds.items()) + "; give files of one kind")
    for path, kind in kinds.items():
        if kind in UNLABELLED:
            what, method = UNLABELLED[kind]
            raise DataError(f"{path} holds {what}, which --method {method} trains on, not labelled pairs")
    out = LabelledPairs(next(iter(kinds.values())))
    for path in paths:
        if out.kind == "nli":
            rows = [(e.premise, e.hypothesis, e.label) for e in read_nli(path)]
        else:
            reader = read_qqp if out.kind == "qqp" else read_sts
            rows = [(p.sentence1, p.sentence2, p.label) for p in reader(path, labeled=True)]
        for s1, s2, label in rows:
            out.sentence1.append(s1)
            out.sentence2.append(s2)
            out.labels.append(label)
        out.sources.append(str(path))
    return out


def read_parallel(path: str | os.PathLike) -> tuple[list[str], list[str] | None]:
    """(sources, targets) of ``source<TAB>target`` lines, or (sentences, None) for one sentence a
    line; the first non-blank line decides which, every later line must agree. Blank lines are
    skipped; a line with a blank side is an error naming it."""
    path = Path(path)
    sources, targets, columns = [], [], None
    with open_text(path, "training file", newline="\n") as handle:
        try:
            for number, line in enumerate(handle, start=1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                fields = [f.strip() for f in line.split("\t")]
                columns = columns or len(fields)
                if len(fields) != columns or columns > 2:
                    expected = {1: "one sentence, as the file's first line", 2: "source<TAB>target, as the file's "
                                "first line"}.get(columns, "one sentence or source<TAB>target")
                    raise DataError(f"{path} line {number}: expected {expected}, found {len(fields)} "
                                    f"tab-separated fields")
                if not all(fields):
                    raise DataError(f"{path} line {number}: a blank sentence")
                sources.append(fields[0])
                if columns == 2:
                    targets.append(fields[1])
        except UnicodeDecodeError as error:
            raise not_text(path, error, "training file") from None
    if not sources:
        raise DataError(f"training file {path} is empty")
    return sources, (targets if columns == 2 else None)
