"""Natural language inference data in its published formats, and what the supervised objectives
build from it: labelled pairs (SBERT's classification objective) and (anchor, entailment,
contradiction) triples (supervised SimCSE).

SNLI (Bowman et al. 2015) and MultiNLI (Williams et al. 2018) are published as

- ``.jsonl``: one JSON object a line with ``sentence1``, ``sentence2`` and ``gold_label``;
- ``.txt``: tab-separated, no quoting, a header naming ``gold_label``, ``sentence1`` and
  ``sentence2`` among other columns (parses, pair ids, the five annotators' labels);

and the Hugging Face ``snli`` export (``../shared/data/nli``) as

- a TSV with the header ``premise<TAB>hypothesis<TAB>label``, labels 0, 1, 2 (entailment,
  neutral, contradiction) or their names, no quoting.

Pairs whose annotators did not agree (gold label ``-``; ``-1`` in the Hugging Face export) have
no label and are skipped, with a count on the ``bertcf.data`` logger, as are pairs with a blank
sentence. A malformed row or an unknown label is a :class:`DataError` naming the file and line.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from .reading import not_text, open_text

logger = logging.getLogger("bertcf.data")

#: The three classes; a label's index is its number in the Hugging Face ``snli`` encoding.
LABELS = ("entailment", "neutral", "contradiction")
NO_GOLD = ("-", "-1")  # a pair without a gold label: skipped
TSV_HEADER = ("premise", "hypothesis", "label")


@dataclass(frozen=True)
class NLIExample:
    premise: str
    hypothesis: str
    label: int  # index into LABELS


def parse_label(text: str) -> int | None:
    """A label's index in LABELS (a name in any case, or 0, 1, 2); None for no gold label; a
    ValueError (the message after "line N: ") for anything else."""
    text = text.strip()
    if text in NO_GOLD:
        return None
    if text.lower() in LABELS:
        return LABELS.index(text.lower())
    if text in ("0", "1", "2"):
        return int(text)
    raise ValueError(f"label {text!r} is not one of {', '.join(LABELS)} (or 0, 1, 2)")


def _jsonl_rows(path: Path, lines):
    """(line number, premise, hypothesis, label text) of a .jsonl file."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise DataError(f"{path} line {number}: not a JSON object ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number}: not a JSON object")
        missing = [k for k in ("sentence1", "sentence2", "gold_label") if not isinstance(row.get(k), str)]
        if missing:
            raise DataError(f"{path} line {number}: no {', '.join(repr(k) for k in missing)} (a string)")
        yield number, row["sentence1"], row["sentence2"], row["gold_label"]


def _tsv_rows(path: Path, lines, header: list[str]):
    """(line number, premise, hypothesis, label text) of SNLI's .txt or the premise/hypothesis/label TSV."""
    if "gold_label" in header:
        names = ("sentence1", "sentence2", "gold_label")
    elif tuple(h.strip() for h in header) == TSV_HEADER:
        names = TSV_HEADER
    else:
        raise DataError(f"{path} line 1: not an NLI header (expected SNLI/MultiNLI's gold_label, sentence1, "
                        f"sentence2 ... or premise<TAB>hypothesis<TAB>label; found {', '.join(header)})")
    missing = [n for n in names if n not in header]
    if missing:
        raise DataError(f"{path} line 1: missing column {', '.join(repr(n) for n in missing)}")
    columns = [header.index(n) for n in names]
    for number, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) <= max(columns) or (names == TSV_HEADER and len(fields) != len(header)):
            raise DataError(f"{path} line {number}: expected {len(header)} tab-separated fields, found {len(fields)}")
        yield number, *(fields[c] for c in columns)


def read_nli(path: str | os.PathLike) -> list[NLIExample]:
    """The labelled pairs of an NLI file in one of the module's formats (by its extension, .jsonl,
    or else by its header), in the file's order."""
    path = Path(path)
    with open_text(path, "NLI file", newline="\n") as handle:
        try:
            lines = [(n, line.rstrip("\r\n")) for n, line in enumerate(handle, start=1)]
        except UnicodeDecodeError as error:
            raise not_text(path, error, "NLI file") from None
    if not any(line.strip() for _, line in lines):
        raise DataError(f"NLI file {path} is empty")
    if path.suffix == ".jsonl":
        rows = _jsonl_rows(path, lines)
    else:
        rows = _tsv_rows(path, lines[1:], lines[0][1].split("\t"))
    examples, no_gold, blank = [], 0, 0
    for number, premise, hypothesis, label_text in rows:
        try:
            label = parse_label(label_text)
        except ValueError as e:
            raise DataError(f"{path} line {number}: {e}") from None
        premise, hypothesis = premise.strip(), hypothesis.strip()
        if label is None:
            no_gold += 1
        elif not premise or not hypothesis:
            blank += 1
        else:
            examples.append(NLIExample(premise, hypothesis, label))
    if no_gold or blank:
        logger.warning("%s: skipped %d pairs without a gold label and %d with a blank sentence; %d kept",
                       path, no_gold, blank, len(examples))
    if not examples:
        raise DataError(f"NLI file {path} has no labelled pairs")
    return examples


def nli_triples(examples: list[NLIExample]) -> list[tuple[str, str, str]]:
    """Supervised SimCSE's (anchor, positive, hard negative): each premise with an entailed and a
    contradicted hypothesis, one triple per entailed hypothesis, its contradiction taken in turn
    from the premise's contradictions (SNLI has one of each per premise and annotation round).
    Premises (compared as text) in order of first appearance; neutral pairs take no part."""
    by_premise: dict[str, tuple[list[str], list[str]]] = {}
    for e in examples:
        entailed, contradicted = by_premise.setdefault(e.premise, ([], []))
        if e.label == 0:
            entailed.append(e.hypothesis)
        elif e.label == 2:
            contradicted.append(e.hypothesis)
    return [(premise, positive, contradicted[i % len(contradicted)])
            for premise, (entailed, contradicted) in by_premise.items() if contradicted
            for i, positive in enumerate(entailed)]
