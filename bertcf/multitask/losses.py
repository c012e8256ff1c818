"""Stage 3's losses, each on a head's output and the task's labels (which head takes which:
``bertcf.multitask.heads``):

- :class:`ClassificationLoss`: cross-entropy on logits (a sentence's classes, SBERT's softmax
  pair classifier, several classes of a pair read jointly);
- :class:`HingeCosineLoss`: the report's QQP, a hinge on the clamped cosine;
- :class:`CosineRegressionLoss`: the report's STS, the clamped cosine regressed on the score;
- :class:`PairLogitLoss`, :class:`PairScoreLoss`: a pair read jointly, binary cross-entropy of one
  logit, or the squared error of one score (also a one-sentence regression's);
- :class:`MultipleNegativesRankingLoss`: positive pairs with in-batch negatives.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F



def clamped_cosine(a: torch.Tensor, b: torch.Tensor, margin: float) -> torch.Tensor:
    """y = max(cos(a_i, b_i), h) per row: [b, d], [b, d] -> [b] float32."""
    return F.cosine_similarity(a.float(), b.float(), dim=-1).clamp(min=margin)


def scale_scores(scores: torch.Tensor, margin: float, low: float = 0.0, high: float = 5.0) -> torch.Tensor:
    """Gold scores [low, high] -> [h, 1] (the STS scores [0, 5] by default)."""
    return margin + (1 - margin) * (scores - low) / (high - low)


class ClassificationLoss(nn.Module):
    """Cross-entropy of a classification head (SST-5: Socher et al. 2013, the CS224N default
    project's classifier; a pair's softmax classifier on (u, v, |u - v|): Reimers & Gurevych
    2019, "Sentence-BERT").

    Inputs: ``logits`` [b, C] (the head's output), ``labels`` [b] long in 0..C-1.
    Output: the mean cross-entropy, a float32 scalar."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels.long())


class HingeCosineLoss(nn.Module):
    """The QQP loss of BERT-CF (section 4.3): a cosine hinge on projected sentence vectors.

    With y = max(cos(p1, p2), h) per pair, the loss is 1 - y for duplicates (pull the pair to
    cosine 1) and y - h for non-duplicates (push the cosine below the margin h, where the clamp
    stops the gradient), averaged over the batch. Like sentence-transformers' OnlineContrastive /
    CosineSimilarityLoss family, but with a margin on the cosine (Reimers & Gurevych 2019,
    "Sentence-BERT").

    Inputs: ``p1``, ``p2`` [b, d] (the head applied to each sentence), ``labels`` [b] in {0, 1}
    (1 = duplicate). Output: a float32 scalar. ``margin``: h (0.7 in the report)."""

    def __init__(self, margin: float = 0.7):
        super().__init__()
        self.margin = float(margin)

    def forward(self, p1: torch.Tensor, p2: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        y = clamped_cosine(p1, p2, self.margin)
        labels = labels.to(y.dtype)
        return (labels * (1 - y) + (1 - labels) * (y - self.margin)).mean()

    def extra_repr(self) -> str:
        return f"margin={self.margin}"


class CosineRegressionLoss(nn.Module):
    """The STS loss of BERT-CF (section 4.3): regress the clamped cosine of the projected
    sentence vectors onto the gold score (sentence-transformers' CosineSimilarityLoss,
    Reimers & Gurevych 2019, "Sentence-BERT", with a floor h on the cosine).

    y = max(cos(p1, p2), h); the gold score s in [low, high] ([0, 5] for STS) is scaled linearly
    to t = h + (1 - h)(s - low) / (high - low) in [h, 1]; loss = mean (y - t)^2.

    Inputs: ``p1``, ``p2`` [b, d] (the head applied to each sentence), ``scores`` [b].
    Output: a float32 scalar. ``margin``: h (0 in the report)."""

    def __init__(self, margin: float = 0.0, label_range: tuple[float, float] = (0.0, 5.0)):
        super().__init__()
        self.margin = float(margin)
        self.low, self.high = map(float, label_range)

    def forward(self, p1: torch.Tensor, p2: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        y = clamped_cosine(p1, p2, self.margin)
        target = scale_scores(scores.to(y.dtype), self.margin, self.low, self.high)
        return F.mse_loss(y, target)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, label_range=({self.low:g}, {self.high:g})"


class PairLogitLoss(nn.Module):
    """Two classes on a jointly encoded pair: binary cross-entropy of the head's logit z [b] against
    the label y [b] in {0, 1}, mean over the batch of -(y log s(z) + (1 - y) log(1 - s(z))).
    Output: a float32 scalar."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class PairScoreLoss(nn.Module):
    """A score (a jointly encoded pair's, or one sentence's): mean squared error of the head's
    score y [b] against the gold s [b] scaled from [low, high] to [0, 1], mean (y - (s - low) /
    (high - low))^2 (sentence-transformers' MSELoss on a one-wide output). Output: a float32
    scalar."""

    def __init__(self, label_range: tuple[float, float] = (0.0, 5.0)):
        super().__init__()
        self.low, self.high = map(float, label_range)

    def forward(self, scores: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(scores.float(), (gold.float() - self.low) / (self.high - self.low))


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cos(a_i, b_j) for every i, j: [n, d], [m, d] -> [n, m] float32."""
    return F.normalize(a.float(), p=2, dim=-1) @ F.normalize(b.float(), p=2, dim=-1).T


class MultipleNegativesRankingLoss(nn.Module):
    """Positive pairs (a_i, b_i) with in-batch negatives (Henderson et al. 2017, "Efficient Natural
    Language Response Suggestion for Smart Reply"; sentence-transformers' MultipleNegativesRankingLoss,
    its default direction): for each a_i, the other pairs' b_j are its negatives, and the loss is
    the cross-entropy of the scaled cosines s·cos(a_i, b_j) [b, b] against j = i, averaged.

    Inputs: ``a``, ``b`` [b, d]. Output: a float32 scalar. ``scale``: s (20, as theirs)."""

    def __init__(self, scale: float = 20.0):
        super().__init__()
        self.scale = float(scale)

    def logits(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """s·cos(a_i, b_j): [b, b] float32, row i's right answer at column i."""
        return self.scale * cosine_matrix(a, b)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(a, b), torch.arange(len(a), device=a.device))

    def extra_repr(self) -> str:
        return f"scale={self.scale}"
