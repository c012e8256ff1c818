"""Evaluation: unsupervised STS (Spearman of cosines), alignment and uniformity, and the
supervised metrics of the multitask stage (accuracy, Pearson r)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from scipy import stats

from .bootstrap import interval


def encode_pairs(encoder, pairs, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(f(x1), f(x2)) for a list of PairExample, each [n, D] float32, in one encode call."""
    vectors = encoder.encode([p.sentence1 for p in pairs] + [p.sentence2 for p in pairs], batch_size=batch_size)
    return vectors[:len(pairs)], vectors[len(pairs):]


def alignment(x: torch.Tensor, y: torch.Tensor) -> float:
    """Wang & Isola (2020): mean ||x_i - y_i||^2 over positive pairs of L2-normalised rows."""
    x, y = F.normalize(x.float(), dim=-1), F.normalize(y.float(), dim=-1)
    return (x - y).pow(2).sum(-1).mean().item()


def uniformity(x: torch.Tensor, t: float = 2.0) -> float:
    """Wang & Isola (2020): log mean_{i<j} exp(-t ||x_i - x_j||^2) of L2-normalised rows."""
    x = F.normalize(x.float(), dim=-1)
    return torch.pdist(x).pow(2).mul(-t).exp().mean().log().item()


def spearman(a, b) -> float:
    return float(stats.spearmanr(torch.as_tensor(a).tolist(), torch.as_tensor(b).tolist()).statistic)


def pearson(a, b) -> float:
    return float(stats.pearsonr(torch.as_tensor(a).tolist(), torch.as_tensor(b).tolist()).statistic)


def accuracy(predicted, gold) -> float:
    predicted, gold = torch.as_tensor(predicted), torch.as_tensor(gold)
    return (predicted == gold).float().mean().item()


def evaluate_sts(encoder, pairs, batch_size: int = 64, positive_threshold: float = 4.0) -> dict:
    """Unsupervised STS: Spearman between cos(f(x1), f(x2)) and the gold scores, plus the
    alignment of the close pairs (gold >= 4, as SimCSE does) and the uniformity of all
    sentences. ``cosines`` is returned for a histogram."""
    return sts_scores(*encode_pairs(encoder, pairs, batch_size), pairs, positive_threshold)


class STSDevEvaluator:
    """Unsupervised STS on ``pairs`` (PairExample with gold scores): ``evaluator(encoder)`` encodes
    both sides once (whole sentences up to the encoder's ``max_length``) and returns
    :func:`sts_scores` (with ``cosines`` for a histogram) and ``sts_spearman_ci95`` ([lo, hi]: the
    95% percentile bootstrap interval of the Spearman correlation over ``resamples`` resamples of
    the pairs, a fixed seed; :mod:`bertcf.evaluation.bootstrap`), plus, when the encoder has a flow
    or a linear head (a whitening), its vectors' ``latent_mean_norm`` and ``latent_log10_eig_ratio``.
    The main metric, which picks a pretraining run's best checkpoint, is the Spearman correlation."""

    main_metric = "sts_spearman"

    def __init__(self, pairs, batch_size: int = 64, resamples: int = 1000, seed: int = 0):
        self.pairs, self.batch_size, self.resamples, self.seed = pairs, batch_size, resamples, seed

    def __call__(self, encoder) -> dict:
        x, y = encode_pairs(encoder, self.pairs, self.batch_size)
        result = sts_scores(x, y, self.pairs)
        result["sts_spearman_ci95"] = interval(result["cosines"], [p.label for p in self.pairs], "spearman",
                                               self.resamples, self.seed)
        if encoder.flow is not None or getattr(encoder, "dense", None) is not None:  # latents F(x), whitened vectors
            stats = latent_stats(x)
            result |= {"latent_mean_norm": stats["mean_norm"], "latent_log10_eig_ratio": stats["log10_eig_ratio"]}
        return result


def sts_scores(x: torch.Tensor, y: torch.Tensor, pairs, positive_threshold: float = 4.0) -> dict:
    """:func:`evaluate_sts` on vectors already encoded: x, y [n, D] of the pairs' sentences."""
    cosines = F.cosine_similarity(x, y, dim=-1)
    gold = torch.tensor([p.label for p in pairs], dtype=torch.float32)
    close = gold >= positive_threshold
    return {"sts_spearman": spearman(cosines, gold), "sts_pearson": pearson(cosines, gold),
            "alignment": alignment(x[close], y[close]) if close.any() else float("nan"),
            "uniformity": uniformity(torch.cat([x, y])), "cosines": cosines}


@torch.no_grad()
def latent_stats(z):
    """Summary of latents z [b, D] for logging: mean row L2 norm and the spread of the covariance
    eigenvalues (an isotropic Gaussian has eig_ratio ~ 1, up to sampling noise)."""
    z = z.detach().double()
    eig = torch.linalg.eigvalsh(torch.cov(z.T).reshape(z.shape[1], z.shape[1]))
    eig_max = eig.max().item()
    eig_min = eig.min().clamp_min(1e-300).item()
    ratio = eig_max / eig_min
    return dict(
        mean_norm=z.norm(dim=1).mean().item(),
        eig_max=eig_max,
        eig_min=eig.min().item(),
        eig_ratio=ratio,
        log10_eig_ratio=math.log10(ratio),
    )
