"""Readers of SentEval's evaluation files (the layout of SentEval's ``data/downstream/``).

SentEval (Conneau & Kiela 2018) is the standard sentence-embedding evaluation that SimCSE,
Mirror-BERT, BSL and Contrastive Tension report. Each reader follows SentEval's own parsing:
fields are split on tabs (no CSV quoting), sentences are whitespace-tokenised and joined again
with single spaces (SentEval splits them, SimCSE's batcher joins them), MR/CR/SUBJ/MPQA and TREC
are read as latin-1, the rest as UTF-8. A malformed line raises :class:`~bertcf.data.DataError`
naming the file and line.

Layout under ``senteval_dir``::

    STS/STS1{2..6}-en-test/STS.input.<subset>.txt, STS.gs.<subset>.txt
    STS/STSBenchmark/sts-{train,dev,test}.csv      genre, file, year, id, score, s1, s2
    SICK/SICK_{train,trial,test_annotated}.txt     header; pair_ID, s1, s2, relatedness, ...
    MR/rt-polarity.{pos,neg}   CR/custrev.{pos,neg}   SUBJ/subj.{objective,subjective}
    MPQA/mpqa.{pos,neg}        SST/binary/sentiment-{train,dev,test} (sentence, tab, 0|1)
    TREC/train_5500.label, TREC_10.label           LABEL:fine question
    MRPC/msr_paraphrase_{train,test}.txt           BOM, header; label, id1, id2, s1, s2
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from ..errors import DataError
from .reading import read_lines
from .tasks import PairExample

#: SentEval's subsets of each STS year (STS13 without SMT, which is not distributed).
STS_YEARS: dict[str, tuple[str, ...]] = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
STS_TASKS = (*STS_YEARS, "STSBenchmark", "SICKRelatedness")
TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")

#: The files of each task, relative to ``senteval_dir`` (STS12-16: their folder).
STSB_FILES = {split: f"STS/STSBenchmark/sts-{split}.csv" for split in ("train", "dev", "test")}
SICK_FILES = {"train": "SICK/SICK_train.txt", "dev": "SICK/SICK_trial.txt", "test": "SICK/SICK_test_annotated.txt"}
BINARY_FILES = {  # task -> (label 1 file, label 0 file), as SentEval labels them
    "MR": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"),
    "CR": ("CR/custrev.pos", "CR/custrev.neg"),
    "SUBJ": ("SUBJ/subj.objective", "SUBJ/subj.subjective"),
    "MPQA": ("MPQA/mpqa.pos", "MPQA/mpqa.neg"),
}
SST2_FILES = {split: f"SST/binary/sentiment-{split}" for split in ("train", "dev", "test")}
TREC_FILES = {"train": "TREC/train_5500.label", "test": "TREC/TREC_10.label"}
MRPC_FILES = {"train": "MRPC/msr_paraphrase_train.txt", "test": "MRPC/msr_paraphrase_test.txt"}


def sts_year_dir(senteval_dir, year: str) -> Path:
    return Path(senteval_dir) / "STS" / f"{year}-en-test"


def sts_year_files(senteval_dir, year: str) -> list[Path]:
    folder = sts_year_dir(senteval_dir, year)
    return [folder / f"STS.{kind}.{subset}.txt" for subset in STS_YEARS[year] for kind in ("input", "gs")]


def _normalise(text: str) -> str:
    """SentEval's ``s.split()`` joined again by a space: the sentence the encoder sees."""
    return " ".join(text.split())


def _fields(path: Path, number: int, line: str, count: int) -> list[str]:
    fields = line.strip().split("\t")
    if len(fields) < count:
        raise DataError(f"{path} line {number}: expected at least {count} tab-separated fields, found {len(fields)}")
    return fields


def _score(path: Path, number: int, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{path} line {number}: score {text!r} is not a number") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise DataError(f"{path} line {number}: score {text!r} is out of range ({low:g} to {high:g})")
    return value


def _label(path: Path, number: int, text: str, labels: tuple[str, ...]) -> int:
    if text not in labels:
        raise DataError(f"{path} line {number}: label {text!r} is not one of {', '.join(labels)}")
    return labels.index(text)


# ---- STS --------------------------------------------------------------------------------------
def read_sts_subset(input_path, gs_path) -> list[PairExample]:
    """One STS12-16 subset: ``STS.input`` (s1 tab s2) and ``STS.gs`` (a score 0..5 per line,
    empty where the pair has no gold score: such pairs are skipped, as SentEval does)."""
    input_path, gs_path = Path(input_path), Path(gs_path)
    inputs, scores = read_lines(input_path, encoding="utf-8"), read_lines(gs_path, encoding="utf-8")
    if len(inputs) != len(scores):
        raise DataError(f"{gs_path} has {len(scores)} lines but {input_path} has {len(inputs)}")
    pairs = []
    for number, (line, score) in enumerate(zip(inputs, scores), start=1):
        fields = _fields(input_path, number, line, 2)
        if not score.strip():
            continue
        pairs.append(PairExample(f"{input_path.name}:{number}", _normalise(fields[0]), _normalise(fields[1]),
                                 _score(gs_path, number, score.strip(), 0.0, 5.0)))
    if not pairs:
        raise DataError(f"{gs_path} has no scored pairs")
    return pairs


def read_sts_year(senteval_dir, year: str) -> dict[str, list[PairExample]]:
    """``{subset: pairs}`` of one STS year, SentEval's subsets in its order. Other files in the
    folder (``STS.gs.ALL.txt``, readmes) are not subsets and are ignored."""
    folder = sts_year_dir(senteval_dir, year)
    return {subset: read_sts_subset(folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt")
            for subset in STS_YEARS[year]}


def read_stsb(path) -> list[PairExample]:
    """SentEval's STS Benchmark file: no header, score in field 5, sentences in fields 6 and 7."""
    path = Path(path)
    pairs = []
    for number, line in enumerate(read_lines(path, encoding="utf-8"), start=1):
        if line.strip():
            f = _fields(path, number, line, 7)
            pairs.append(PairExample(f"{path.name}:{number}", _normalise(f[5]), _normalise(f[6]),
                                     _score(path, number, f[4], 0.0, 5.0)))
    return _nonempty(path, pairs)


def read_sick(path) -> list[PairExample]:
    """A SICK file: a header line, then pair_ID, sentence_A, sentence_B, relatedness (1..5), ..."""
    path = Path(path)
    pairs = []
    for number, line in enumerate(read_lines(path, encoding="utf-8")[1:], start=2):
        if line.strip():
            f = _fields(path, number, line, 4)
            pairs.append(PairExample(f[0], _normalise(f[1]), _normalise(f[2]), _score(path, number, f[3], 1.0, 5.0)))
    return _nonempty(path, pairs)


# ---- transfer tasks ---------------------------------------------------------------------------
def read_binary(label1_path, label0_path) -> tuple[list[str], list[int]]:
    """MR, CR, SUBJ, MPQA: one sentence a line, latin-1; the first file is label 1. Blank lines
    stay, as empty sentences (SentEval keeps them: CR's 3,775 sentences include 4)."""
    sentences, labels = [], []
    for path, label in ((Path(label1_path), 1), (Path(label0_path), 0)):
        lines = _nonempty(path, [_normalise(line) for line in read_lines(path, encoding="latin-1")])
        sentences += lines
        labels += [label] * len(lines)
    return sentences, labels


def read_sst2(path) -> tuple[list[str], list[int]]:
    """SST-2 (SentEval's ``SST/binary``): sentence, tab, 0 or 1."""
    path = Path(path)
    sentences, labels = [], []
    for number, line in enumerate(read_lines(path, encoding="utf-8"), start=1):
        if line.strip():
            f = _fields(path, number, line, 2)
            sentences.append(_normalise(f[0]))
            labels.append(_label(path, number, f[1].strip(), ("0", "1")))
    return _nonempty(path, sentences), labels


def read_trec(path) -> tuple[list[str], list[int]]:
    """TREC: ``COARSE:fine question words`` (latin-1); the label is the coarse class (6)."""
    path = Path(path)
    sentences, labels = [], []
    for number, line in enumerate(read_lines(path, encoding="latin-1"), start=1):
        if not line.strip():
            continue
        target, colon, rest = line.strip().partition(":")
        words = rest.split(" ", 1)
        if not colon or len(words) < 2 or not words[1].strip():
            raise DataError(f"{path} line {number}: expected 'CLASS:fine question', found {line.strip()[:40]!r}")
        labels.append(_label(path, number, target, TREC_CLASSES))
        sentences.append(_normalise(words[1]))
    return _nonempty(path, sentences), labels


def read_mrpc(path) -> tuple[list[PairExample], list[int]]:
    """MRPC: a header line (after a byte-order mark), then label, id1, id2, sentence1, sentence2."""
    path = Path(path)
    pairs, labels = [], []
    for number, line in enumerate(read_lines(path, encoding="utf-8-sig")[1:], start=2):
        if line.strip():
            f = _fields(path, number, line, 5)
            labels.append(_label(path, number, f[0], ("0", "1")))
            pairs.append(PairExample(f"{f[1]}-{f[2]}", _normalise(f[3]), _normalise(f[4]), float(labels[-1])))
    return _nonempty(path, pairs), labels


def _nonempty(path: Path, rows: list) -> list:
    if not rows:
        raise DataError(f"{path} has no usable lines")
    return rows


def missing_files(senteval_dir, relative: list[str] | list[Path]) -> list[Path]:
    """The files of ``relative`` (paths under ``senteval_dir``, or absolute) that are absent."""
    return [p for p in (Path(senteval_dir) / r for r in relative) if not p.is_file()]


def check_dir(senteval_dir) -> Path:
    path = Path(senteval_dir)
    if not path.is_dir():
        raise DataError(f"--senteval-dir {os.fspath(path)} is not a directory (python -m bertcf.data download "
                        f"--senteval --out data/ puts SentEval's files in data/SentEval; see data/README.md)")
    return path
