"""Hard negatives mined for (query, positive) pairs (``mine``): for each query, the corpus entries
an encoder ranks nearest that are not one of its positives, filtered and drawn as
sentence-transformers' ``mine_hard_negatives`` does (rank range, score bounds, an absolute or
relative margin to the positive, the top ones or a random draw), by exact search in chunks so that
memory stays bounded on a large corpus; written as (anchor, positive, negative) rows
(``write_triplets``) that supervised SimCSE trains on (``read_triplets``); and the same rows with a
cross-encoder's margin each (``write_margins``, ``read_margins``), which MarginMSE trains on (GPL).

The pairs come from a file of ``query<TAB>positive`` lines, an NLI file's entailment pairs, or a
set in BEIR's layout (its queries and relevant documents, its corpus the candidates)."""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DataError, UsageError
from ..utils.files import write_text_atomic
from .nli import read_nli
from .reading import not_text, open_text

TRIPLET_HEADER = ("anchor", "positive", "negative")
MARGIN_HEADER = ("query", "positive", "negative", "margin")
#: The header of a (query, positive) pairs file that a training file's kind is told by (``pairs.pair_kind``).
PAIR_HEADERS = (("query", "positive"), ("anchor", "positive"))

if TYPE_CHECKING:  # torch is imported by the search alone: Mining's defaults are the command line's (config)
    import torch


@dataclass(frozen=True)
class Mining:
    """How negatives are chosen, with ``mine_hard_negatives``' meaning and defaults: of the
    candidates ranked ``range_min`` to ``range_max`` (default: ``range_min + num_negatives`` plus
    the most positives a query has, ten times the negatives when a margin or ``max_score`` may
    reject some), those scoring at most ``max_score`` and at least ``min_score``, and at least
    ``absolute_margin`` below the query's lowest positive score, or ``relative_margin`` of its
    magnitude below it; then the ``num_negatives`` best (``sampling`` "top") or a draw among them
    ("random", seeded by ``seed``)."""

    num_negatives: int = 3
    range_min: int = 0
    range_max: int | None = None
    max_score: float | None = None
    min_score: float | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    sampling: str = "top"
    seed: int = 0
    chunk_size: int = 16384  # queries (and corpus entries) scored at once

    def window(self, max_positives: int) -> int:
        """``range_max`` (its default computed as the docstring says), checked."""
        wide = any(v is not None for v in (self.absolute_margin, self.relative_margin, self.max_score))
        range_max = self.range_max or self.range_min + self.num_negatives * (10 if wide else 1) + max_positives
        if self.num_negatives < 1 or self.range_min < 0 or self.range_min >= range_max:
            raise UsageError(f"--range-min {self.range_min} and --range-max {range_max} leave no candidate rank")
        if self.num_negatives > range_max - self.range_min:
            raise UsageError(f"--num-negatives {self.num_negatives}: only {range_max - self.range_min} candidate ranks "
                             f"between --range-min {self.range_min} and --range-max {range_max}")
        return range_max


# ---- the pairs --------------------------------------------------------------------------------------
def read_query_pairs(path) -> tuple[list[str], list[str]]:
    """(queries, positives) of a file of ``query<TAB>positive`` lines (a first line ``query<TAB>positive``
    or ``anchor<TAB>positive`` is a header); blank lines are skipped."""
    path, queries, positives = Path(path), [], []
    with open_text(path, "pairs file", newline="\n") as handle:
        try:
            for number, line in enumerate(handle, start=1):
                fields = [f.strip() for f in line.rstrip("\r\n").split("\t")]
                if not any(fields) or (number == 1 and fields[1:2] == ["positive"]):
                    continue
                if len(fields) != 2 or not all(fields):
                    raise DataError(f"{path} line {number}: expected query<TAB>positive, found {len(fields)} "
                                    f"tab-separated field(s)" + ("" if len(fields) != 2 else " with a blank one"))
                queries.append(fields[0])
                positives.append(fields[1])
        except UnicodeDecodeError as error:
            raise not_text(path, error, "pairs file") from None
    if not queries:
        raise DataError(f"{path} holds no (query, positive) pairs")
    return queries, positives


def nli_pairs(path) -> tuple[list[str], list[str]]:
    """(premises, hypotheses) of an NLI file's entailment pairs."""
    pairs = [(e.premise, e.hypothesis) for e in read_nli(path) if e.label == 0]
    if not pairs:
        raise DataError(f"{path}: no entailment pairs, so no (query, positive) pairs to mine negatives for")
    return [p for p, _ in pairs], [h for _, h in pairs]


def beir_pairs(directory, split: str) -> tuple[list[str], list[str], list[str]]:
    """(queries, positives, corpus) of a set in BEIR's layout: each query with each document its
    qrels of ``split`` (``qrels/SPLIT.tsv``) call relevant (score > 0); the corpus is every document."""
    from .beir import load

    data = load(directory, split)
    pairs = [(data.queries[q], data.corpus[d]) for q, docs in data.qrels.items() if q in data.queries
             for d, score in docs.items() if score > 0 and d in data.corpus]
    if not pairs:
        raise DataError(f"{directory}: no query has a relevant document in the corpus")
    return [q for q, _ in pairs], [p for _, p in pairs], list(data.corpus.values())


# ---- the search -------------------------------------------------------------------------------------
def mine(queries: list[str], positives: list[str], corpus: list[str] | None, embed,
         settings: Mining = Mining()) -> list[tuple[str, str, str]]:
    """(anchor, positive, negative) rows: for each (query, positive) pair (a query with several
    positives has them all as positives), its ``num_negatives`` mined negatives, one row each, in
    the order of the queries' first appearance, then their positives', then the negatives' rank.
    ``corpus``: the candidates besides the positives (None: the positives alone). ``embed(texts)``:
    their unit vectors [n, D]. A query whose candidates the filters exhaust gets fewer rows."""
    import torch

    from ..utils.topk import nearest

    corpus = list(dict.fromkeys((corpus or []) + positives))
    where = {text: i for i, text in enumerate(corpus)}
    unique = list(dict.fromkeys(queries))
    counts = {}
    for q in queries:
        counts[q] = counts.get(q, 0) + 1
    own: dict[str, list[int]] = {q: [] for q in unique}
    for q, p in zip(queries, positives):
        if where[p] not in own[q]:
            own[q].append(where[p])
    range_max = settings.window(max(counts.values()))
    query_vectors, corpus_vectors = embed(unique).float(), embed(corpus).float()
    scores, indices = nearest(query_vectors, corpus_vectors, range_max + max(counts.values()), settings.chunk_size)
    floor = torch.stack([(query_vectors[i:i + 1] @ corpus_vectors[own[q]].T).min() for i, q in enumerate(unique)])
    scores = filtered(scores, indices, [own[q] for q in unique], floor, settings)
    negatives, negative_scores = choose(scores, indices, range_max, settings)
    return [(q, corpus[p], corpus[int(n)]) for i, q in enumerate(unique) for p in own[q]
            for n, s in zip(negatives[i], negative_scores[i]) if s != float("-inf")]


def mine_and_write(path, encoder, queries: list[str], positives: list[str], corpus: list[str] | None,
                   settings: Mining, batch_size: int = 64, show_progress_bar: bool = True) -> dict:
    """``mine`` on the unit vectors of ``encoder`` (what has SentenceEncoder's ``encode``: data/ is
    below models/), ``batch_size`` sentences encoded at once, and the rows written to ``path``
    (``write_triplets``): {"rows": the rows written, "pairs": the distinct (query, positive) pairs}."""
    def embed(texts):
        return encoder.encode(texts, batch_size=batch_size, show_progress_bar=show_progress_bar, normalize=True)
    rows = mine(queries, positives, corpus, embed, settings)
    write_triplets(path, rows)
    return {"rows": len(rows), "pairs": len(dict.fromkeys(zip(queries, positives)))}


def filtered(scores, indices, positives: list[list[int]], floor, s: Mining) -> torch.Tensor:
    """``scores`` with -inf for every candidate that may not be a negative: padding, a positive of
    its query, and those the margins (to ``floor``, each query's lowest positive score) and the
    score bounds reject."""
    import torch

    scores = scores.clone()
    scores[indices == -1] = float("-inf")
    for i, own in enumerate(positives):
        scores[i, torch.isin(indices[i], torch.tensor(own))] = float("-inf")
    floor = floor[:, None]
    if s.absolute_margin is not None:
        scores[scores + s.absolute_margin > floor] = float("-inf")
    if s.relative_margin is not None:
        scores[scores > floor - floor.abs() * s.relative_margin] = float("-inf")
    if s.max_score is not None:
        scores[scores > s.max_score] = float("-inf")
    if s.min_score is not None:
        scores[scores < s.min_score] = float("-inf")
    return scores


def choose(scores, indices, range_max: int, s: Mining) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's negatives [q, num_negatives] and their scores: the best ``range_max`` candidates
    after the filters, without the first ``range_min``, then the top ones or a seeded draw among
    the valid ones (the draw's order: by score)."""
    import torch

    best, local = torch.topk(scores, k=range_max, dim=1)
    chosen = indices.gather(1, local)[:, s.range_min:]
    best = best[:, s.range_min:]
    if s.sampling == "top":
        return chosen[:, :s.num_negatives], best[:, :s.num_negatives]
    g = torch.Generator().manual_seed(s.seed)
    rows = []
    for row_scores in best:
        options = max(int(torch.isfinite(row_scores).sum()), s.num_negatives)
        rows.append(torch.randperm(options, generator=g)[:s.num_negatives].sort().values)
    picked = torch.stack(rows)
    return chosen.gather(1, picked), best.gather(1, picked)


# ---- the triplet files ------------------------------------------------------------------------------
def write_triplets(path, rows: list[tuple[str, str, str]]) -> None:
    """``anchor<TAB>positive<TAB>negative`` lines under that header, written atomically."""
    if not rows:
        raise DataError("no query got a negative: nothing to write (loosen --range-max, --max-score or the margins)")
    lines = ["\t".join(TRIPLET_HEADER)] + ["\t".join(t.replace("\t", " ").replace("\n", " ") for t in row)
                                          for row in rows]
    write_text_atomic(path, "\n".join(lines) + "\n")


def read_tsv(path, header: tuple[str, ...], what: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of each non-blank line after ``header`` in the TSV ``path``; a missing
    or undecodable file, or another header, is one DataError line naming ``what`` it should be."""
    path = Path(path)
    with open_text(path, what, newline="") as handle:
        try:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
        except UnicodeDecodeError as error:
            raise not_text(path, error, what) from None
    if not rows or tuple(rows[0]) != header:
        raise DataError(f"{path} line 1: expected the header {'<TAB>'.join(header)}")
    return [(number, row) for number, row in enumerate(rows[1:], start=2) if row]


def read_triplets(path: str | os.PathLike) -> list[tuple[str, str, str]]:
    """The (anchor, positive, negative) rows of a file ``write_triplets`` wrote."""
    rows = read_tsv(path, TRIPLET_HEADER, "triplets file")
    for number, row in rows:
        if len(row) != 3 or not all(f.strip() for f in row):
            raise DataError(f"{path} line {number}: expected anchor<TAB>positive<TAB>negative")
    if not rows:
        raise DataError(f"{path} holds no triplets")
    return [tuple(row) for _, row in rows]


# ---- the margins files (GPL) ------------------------------------------------------------------------
def write_margins(path, rows: list[tuple[str, str, str, float]]) -> None:
    """``query<TAB>positive<TAB>negative<TAB>margin`` lines under that header, written atomically;
    a margin is written in full (``repr``), so it reads back bit for bit."""
    if not rows:
        raise DataError("no (query, positive, negative) rows: no margins to write")
    lines = ["\t".join(MARGIN_HEADER)] + ["\t".join([*(t.replace("\t", " ").replace("\n", " ") for t in row[:3]),
                                                     repr(float(row[3]))]) for row in rows]
    write_text_atomic(path, "\n".join(lines) + "\n")


def read_margins(path: str | os.PathLike) -> list[tuple[str, str, str, float]]:
    """The (query, positive, negative, margin) rows of a file ``write_margins`` wrote (or any TSV
    with that header): the margin a finite number, the texts not blank."""
    out = []
    for number, row in read_tsv(path, MARGIN_HEADER, "margins file"):
        try:
            margin = float(row[3]) if len(row) == 4 else math.nan
        except ValueError:
            margin = math.nan
        if len(row) != 4 or not all(f.strip() for f in row[:3]) or not math.isfinite(margin):
            raise DataError(f"{path} line {number}: expected query<TAB>positive<TAB>negative<TAB>margin, the "
                            f"margin a finite number")
        out.append((row[0], row[1], row[2], margin))
    if not out:
        raise DataError(f"{path} holds no (query, positive, negative, margin) rows")
    return out
