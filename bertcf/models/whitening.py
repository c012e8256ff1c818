"""BERT-whitening: a closed-form linear map that makes sentence vectors isotropic, the control that
BERT-flow's critics proposed (Su, Cao, Liu & Ou 2021, "Whitening Sentence Representations for
Better Semantics and Faster Retrieval", arXiv:2103.15316; code: github.com/bojone/BERT-whitening).

On the vectors x_i [n, D] of a fitting set (a corpus, or the target sets' own sentences, the
paper's "target" variant):

    mu = mean_i x_i,   Sigma = cov(x) (unbiased, 1/(n-1), as numpy.cov in the paper's code),
    Sigma = U Lambda U^T (its SVD),   W = U Lambda^(-1/2),   y = (x - mu) W[:, :k]

so that the y of the fitting set have mean 0 and covariance I_k; keeping the first k columns (the
directions of largest variance) is the paper's dimensionality reduction (``--whiten-dim k``). The
map is an ``nn.Linear`` with weight W[:, :k]^T and bias -mu W[:, :k]: ``SentenceEncoder.dense``,
which a checkpoint stores as sentence-transformers' Dense module.

Everything is computed in float64 (the vectors are float32; their covariance and its inverse
square root are not well conditioned in float32), then stored in float32.

A singular covariance: with fewer sentences than dimensions (rank <= n - 1) or a constant
dimension, some eigenvalues are zero and Lambda^(-1/2) is infinite there. Those null directions
are dropped: the map has min(k, r) outputs, r the covariance's numerical rank (eigenvalues above
numpy.linalg.matrix_rank's tolerance, lambda_max * max(n, D) * float64 eps). A floor on the
eigenvalues would keep them, but multiply whatever variance new sentences have in a direction the
fitting set never varied in by 1/sqrt(floor), so that noise would dominate every cosine; dropping
them keeps the map the whitening of the span the fitting set covers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

CHUNK = 65536  # rows cast to float64 at a time: a 1M-sentence corpus never needs [n, D] in float64


@dataclass
class Whitening:
    """A fitted whitening: ``weight`` W [D, k] and ``mean`` mu [D] (float64), the covariance's
    ``eigenvalues`` [D] (descending), ``rank`` r (its numerical rank) and ``sentences`` n."""
    weight: torch.Tensor
    mean: torch.Tensor
    eigenvalues: torch.Tensor
    rank: int
    sentences: int

    @property
    def dim(self) -> int:
        return self.weight.shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """y = (x - mu) W in float64: [n, D] -> [n, k]."""
        return (x.double() - self.mean) @ self.weight

    def linear(self) -> nn.Linear:
        """The map as an ``nn.Linear`` (float32): weight W^T [k, D], bias -mu W [k]."""
        layer = nn.Linear(self.weight.shape[0], self.dim)
        with torch.no_grad():
            layer.weight.copy_(self.weight.T.float())
            layer.bias.copy_((-self.mean @ self.weight).float())
        return layer


def covariance(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean [D], unbiased covariance [D, D]) of ``vectors`` [n, D] in float64, two passes over
    chunks of rows (centred before the products: no cancellation of a large mean)."""
    n = vectors.shape[0]
    mean = sum(chunk.double().sum(0) for chunk in vectors.split(CHUNK)) / n
    cov = torch.zeros(vectors.shape[1], vectors.shape[1], dtype=torch.float64)
    for chunk in vectors.split(CHUNK):
        centred = chunk.double() - mean
        cov += centred.T @ centred
    return mean, cov / (n - 1)


def fit_whitening(vectors: torch.Tensor, dim: int | None = None) -> Whitening:
    """BERT-whitening of ``vectors`` [n, D] (any float dtype), keeping the first ``dim`` directions
    (None: all of them) and never a null direction of the covariance (see the module's doc).

    ValueError for fewer than 2 vectors, a non-finite vector, vectors without any variance, or a
    ``dim`` outside 1..D."""
    n, d = vectors.shape
    if n < 2:
        raise ValueError(f"whitening needs at least 2 vectors to estimate a covariance, not {n}")
    if dim is not None and not 1 <= dim <= d:
        raise ValueError(f"the whitened width must be between 1 and the vectors' {d}, not {dim}")
    if not torch.isfinite(vectors).all():
        raise ValueError("the vectors to whiten hold NaN or infinite values")
    mean, cov = covariance(vectors)
    u, s, _ = torch.linalg.svd(cov)  # cov is symmetric positive semi-definite: s are its eigenvalues, descending
    tolerance = s[0] * max(n, d) * torch.finfo(torch.float64).eps
    rank = int((s > tolerance).sum())
    if rank == 0:
        raise ValueError(f"the {n} vectors to whiten are all the same: they have no variance")
    k = min(dim or d, rank)
    weight = u[:, :k] / s[:k].sqrt()
    return Whitening(weight=weight, mean=mean, eigenvalues=s, rank=rank, sentences=n)
