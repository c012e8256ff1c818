"""Exact top-k search in chunks: each query's ``k`` best corpus rows by score, found a block of
scores at a time so that memory holds one block and the running best, never the whole score
matrix. Retrieval's evaluation (``evaluation.retrieval``), hard-negative mining
(``data.negatives``) and the search benchmark's ground truth (``bench.search``) all rank with it,
so they agree on the order.

Ties. Among equal scores the lower corpus position comes first, in every merge, as
sentence-transformers' InformationRetrievalEvaluator ranks documents (it sorts by score, then by
id; a corpus searched in id order makes the lower position the lower id). ``torch.topk`` alone
picks among ties arbitrarily, so a chunk's ties at the cut are sorted stably."""
from __future__ import annotations

import math

import torch


class TopK:
    """Each query's best ``k`` corpus rows so far, ranked by score, then by position.
    ``values``/``indices``: [queries, k]; unfilled places hold -inf and -1."""

    def __init__(self, queries: int, k: int, dtype: torch.dtype = torch.float32):
        self.k = k
        self.values = torch.full((queries, k), -math.inf, dtype=dtype)
        self.indices = torch.full((queries, k), -1, dtype=torch.long)

    def _chunk_best(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best of each row of ``scores`` [q, c], ties at the k-th score resolved toward lower
        columns (torch.topk picks among them arbitrarily)."""
        k = min(self.k, scores.shape[1])
        values, indices = torch.topk(scores, k, dim=1)
        tied = (scores >= values[:, -1:]).sum(1) > k
        if tied.any():
            exact_values, exact = torch.sort(scores[tied], dim=1, descending=True, stable=True)
            values[tied], indices[tied] = exact_values[:, :k], exact[:, :k]
        return values, indices

    def update(self, first: int, scores: torch.Tensor, offset: int) -> None:
        """Merge the scores [q, c] of queries ``first``.. against the corpus rows at ``offset``.."""
        values, indices = self._chunk_best(scores)
        rows = slice(first, first + scores.shape[0])
        values = torch.cat([self.values[rows], values.to(self.values.dtype)], dim=1)
        indices = torch.cat([self.indices[rows], indices + offset], dim=1)
        # by position first, then stably by score: equal scores keep the lower position first
        by_position = torch.argsort(torch.where(indices < 0, torch.iinfo(torch.long).max, indices), dim=1, stable=True)
        values, indices = values.gather(1, by_position), indices.gather(1, by_position)
        by_score = torch.argsort(values, dim=1, descending=True, stable=True)[:, :self.k]
        self.values[rows], self.indices[rows] = values.gather(1, by_score), indices.gather(1, by_score)


def nearest(queries: torch.Tensor, corpus: torch.Tensor, k: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` highest scores of each query row against the corpus rows (dot products: unit vectors
    give cosines) and their corpus indices, [q, k] each, best first, ties by position; computed
    ``chunk`` queries against ``chunk`` corpus rows at a time, so memory stays O(chunk^2 + q k).
    A corpus of fewer than k rows pads with -inf and index -1."""
    top = TopK(len(queries), k, dtype=queries.dtype)
    for q0 in range(0, len(queries), chunk):
        q = queries[q0:q0 + chunk]
        for c0 in range(0, len(corpus), chunk):
            top.update(q0, q @ corpus[c0:c0 + chunk].T, c0)
    return top.values, top.indices
