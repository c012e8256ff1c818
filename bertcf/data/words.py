"""Words as data: word lists to pretrain a lexical encoder on, and word-similarity sets to score one.

Mirror-BERT (Liu et al. 2021, section 3) turns an MLM into a word encoder by the same identity
fine-tuning as for sentences, on a list of words instead of sentences: the 10k most frequent words
of the language. ``top_words(n)`` is that list for English from ``wordfreq`` (Speer 2022), a
maintained frequency list; ``read_word_list`` reads any list, one word or phrase per line.

A word-similarity set is a file of word pairs with a human similarity score (``read_word_pairs``):
SimLex-999's layout (a header line naming its columns, ``word1 word2 POS SimLex999 ...``; the
score is the column named ``SimLex999``, or one named ``score``/``similarity``) or a plain
``word1<TAB>word2<TAB>score`` file, with or without a header (a first line whose score field is
not a number). Every ``.txt`` or ``.tsv`` file of a folder is one task (``word_similarity_files``),
named by its file name without the extension.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from .reading import read_lines

#: Header names (lower case) of the score column, in the order they are looked for.
SCORE_COLUMNS = ("simlex999", "score", "similarity", "sim", "gold")
TASK_SUFFIXES = (".txt", ".tsv")


def top_words(n: int, lang: str = "en") -> tuple[list[str], str]:
    """(the ``n`` most frequent words of ``lang``, a line saying where they come from), from
    wordfreq's ``top_n_list`` (its "best" list: words as wordfreq tokenises them, so contractions
    like "don't" and numerals like "2" are among them)."""
    from importlib.metadata import version

    import wordfreq

    words = wordfreq.top_n_list(lang, n)
    if len(words) < n:
        raise DataError(f"--corpus-words {n}: wordfreq has only {len(words)} words for {lang!r}")
    return words, f"wordfreq {version('wordfreq')} top_n_list({lang!r}, {n})"


def read_word_list(path) -> list[str]:
    """A word list: one word or phrase per line, stripped, inner whitespace made single spaces;
    blank lines are skipped and a repeated entry is kept once (in a contrastive batch a duplicate
    would be a negative identical to the positive). DataError when it has no entry."""
    path = Path(path)
    words = list(dict.fromkeys(" ".join(line.split()) for line in read_lines(path, "word list")))
    words = [w for w in words if w]
    if not words:
        raise DataError(f"word list {path} is empty (one word or phrase per line)")
    return words


@dataclass(frozen=True)
class WordPair:
    word1: str
    word2: str
    score: float


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _fields(line: str) -> list[str]:
    """A row's fields: split on tabs, or on whitespace in a line without a tab."""
    return [f.strip() for f in line.split("\t")] if "\t" in line else line.split()


def read_word_pairs(path) -> list[WordPair]:
    """The pairs of a word-similarity file (layouts: the module's docstring). A row with fewer
    fields than the score's column, an empty word or a score that is not a finite number is a
    DataError naming the file and line; so is a file without pairs."""
    path = Path(path)
    lines = read_lines(path, "word-similarity file")
    rows = [(i, _fields(line)) for i, line in enumerate(lines, start=1) if line.strip()]
    if not rows:
        raise DataError(f"word-similarity file {path} is empty")
    score_column = 2
    first = rows[0][1]
    if len(first) < 3 or _number(first[2]) is None:  # a header line
        names = [f.lower() for f in first]
        score_column = next((names.index(n) for n in SCORE_COLUMNS if n in names), 2)
        rows = rows[1:]
    pairs = []
    for line_no, fields in rows:
        where = f"{path} line {line_no}"
        if len(fields) <= score_column:
            raise DataError(f"{where}: {len(fields)} field(s), expected word1, word2 and a score in field "
                            f"{score_column + 1}")
        score = _number(fields[score_column])
        if score is None:
            raise DataError(f"{where}: score {fields[score_column]!r} is not a finite number")
        if not fields[0] or not fields[1]:
            raise DataError(f"{where}: an empty word")
        pairs.append(WordPair(fields[0], fields[1], score))
    if not pairs:
        raise DataError(f"word-similarity file {path} has a header but no pairs")
    return pairs


def word_similarity_files(directory) -> dict[str, Path]:
    """{task name: file} of every ``.txt``/``.tsv`` file in ``directory`` (not hidden), sorted by
    name; DataError when the folder is missing or has none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"--lexical-dir {directory} is not a directory")
    files = sorted(p for p in directory.iterdir()
                   if p.suffix.lower() in TASK_SUFFIXES and not p.name.startswith(".") and p.is_file())
    if not files:
        raise DataError(f"--lexical-dir {directory} has no word-similarity file (.txt or .tsv: word1, word2, "
                        f"score)")
    return {p.stem: p for p in files}
