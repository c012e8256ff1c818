"""Bootstrap resampling of evaluation metrics: percentile intervals and paired comparisons.

A resample of the n evaluation items (drawn with replacement, within groups when given) is
represented by its counts ``w [n]``: how often each item was drawn. Every metric is then a
weighted statistic over the original items, so R resamples are one [R, n] array and no
resample is materialised or sorted:

- accuracy: the weighted mean of (scores == gold);
- Pearson r: the weighted Pearson correlation of (scores, gold);
- Spearman's rho: the weighted Pearson correlation of the resample's tie-averaged ranks. A value
  v drawn c times, with b drawn items below it, has the average rank b + (c + 1) / 2 in the
  resample (its duplicates tie with each other and with equal values), so with the items sorted
  once by value the ranks of every resample are a cumulative sum of counts per tie group
  (integers, exact; no per-resample sort).

A replicate is NaN where the metric is undefined (a resample whose scores or gold are constant,
as scipy returns NaN there); intervals are taken over the defined replicates.

Efron & Tibshirani (1993), *An Introduction to the Bootstrap* (percentile intervals); Koehn
(2004), *Statistical Significance Tests for Machine Translation Evaluation* (the paired bootstrap
over test items); Davison & Hinkley (1997), *Bootstrap Methods and their Application*
(resampling hierarchical data in two stages: here seeds, then items).
"""
from __future__ import annotations

import numpy as np

METRICS = ("spearman", "pearson", "accuracy", "mean")  # mean: of the scores themselves (e.g. reciprocal ranks)


def resample_counts(n: int, resamples: int, rng: np.random.Generator, groups=None) -> np.ndarray:
    """Counts of ``resamples`` bootstrap resamples of n items: [R, n] int64, each row summing to n.

    ``groups``: None, or an array [n] of labels: each group's items are then drawn (with
    replacement) only among that group, as many as the group has, so every row's counts over a
    group sum to the group's size (a stratified bootstrap)."""
    if n < 1 or resamples < 1:
        raise ValueError(f"resample_counts: n and resamples must be at least 1, not {n} and {resamples}")
    if groups is None:
        drawn = rng.integers(0, n, size=(resamples, n))
    else:
        groups = np.asarray(groups)
        if groups.shape != (n,):
            raise ValueError(f"groups has shape {groups.shape}, expected ({n},)")
        _, label = np.unique(groups, return_inverse=True)
        members = [np.flatnonzero(label == g) for g in range(label.max() + 1)]  # a few groups
        # Only which items were drawn matters, not in which column: the groups' draws side by side.
        drawn = np.concatenate([m[rng.integers(0, len(m), size=(resamples, len(m)))] for m in members], axis=1)
    drawn += np.arange(resamples)[:, None] * n  # resample r counts in bins r*n .. r*n + n - 1
    return np.bincount(drawn.ravel(), minlength=resamples * n).reshape(resamples, n)


def _ties(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order: the stable argsort of values [n]; first [n] bool: the sorted item starts a new
    value)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    return order, np.r_[True, ordered[1:] != ordered[:-1]]


def _per_value(counts: np.ndarray, order: np.ndarray, first: np.ndarray) -> np.ndarray:
    """[R, G]: how many items of each distinct value (increasing) every resample drew."""
    in_order = counts if np.array_equal(order, np.arange(len(order))) else counts[:, order]
    return in_order if first.all() else np.add.reduceat(in_order, np.flatnonzero(first), axis=1)


def _constant(values: np.ndarray, counts: np.ndarray, total: np.ndarray) -> np.ndarray:
    """[R] bool: the resample drew one value only (its correlations are undefined)."""
    return _per_value(counts, *_ties(values)).max(axis=1) == total


def _spearman(x: np.ndarray, y: np.ndarray, counts: np.ndarray, total: np.ndarray) -> np.ndarray:
    """[R] Spearman's rho of x [n] and y [n] in the resamples counts [R, n] (total [R] draws each):
    the weighted Pearson r of the tie-averaged ranks. NaN where x or y is constant.

    In a resample of N draws, an item whose value was drawn d times, with b draws below it, has
    the rank b + (d + 1) / 2; the mean rank is (N + 1) / 2, so twice the centred rank is the
    integer 2 C - d - N, C = b + d the draws up to its value (a cumulative sum over the values).
    The weighted means of these ranks are 0 and their weighted sum of squares is (N^3 - sum of
    d^3 over the values) / 3 (the ties' correction; 0 for a constant resample). All sums are
    integers below 2 N^3, exact in int64 for N < 2^20."""
    # In the order of x, whose draws per value (a cosine rarely ties) are then the counts themselves.
    order = np.argsort(x, kind="stable")
    counts, x, y = counts[:, order], x[order], y[order]
    _, first = _ties(x)
    x_drawn = _per_value(counts, np.arange(len(x)), first)  # [R, Gx]
    x_upto = np.cumsum(x_drawn, axis=1)  # integers: a float cumsum along rows is several times slower
    y_order, y_first = _ties(y)
    y_drawn = _per_value(counts, y_order, y_first)  # [R, Gy]
    y_ranks = 2 * np.cumsum(y_drawn, axis=1) - y_drawn - total[:, None]
    y_of = np.empty(len(y), dtype=np.int64)
    y_of[y_order] = np.cumsum(y_first) - 1
    ry = y_ranks[:, y_of]  # [R, n]: each item's
    x_d, x_c = x_drawn, x_upto
    if not first.all():  # ties in x: each item's value's draws
        x_of = np.cumsum(first) - 1
        x_d, x_c = x_drawn[:, x_of], x_upto[:, x_of]
    # sum c rx ry = sum c (2 C - d - N) ry, and sum c ry = 0
    cross = 2 * np.einsum("rn,rn,rn->r", counts, x_c, ry) - np.einsum("rn,rn,rn->r", counts, x_d, ry)
    cubes = [np.einsum("rg,rg,rg->r", d, d, d) for d in (x_drawn, y_drawn)]
    vx, vy = ((total ** 3 - c) / 3 for c in cubes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(cross / np.sqrt(vx * vy), -1.0, 1.0)


def _weighted_correlation(x: np.ndarray, y: np.ndarray, counts: np.ndarray, total: np.ndarray) -> np.ndarray:
    """[R] Pearson r of x [n] and y [n] weighted by counts [R, n]."""
    weights = counts.astype(np.float64)
    mx, my = weights @ x / total, weights @ y / total
    sxy = weights @ (x * y) / total - mx * my
    sxx, syy = weights @ (x * x) / total - mx ** 2, weights @ (y * y) / total - my ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(sxy / np.sqrt(sxx * syy), -1.0, 1.0)


def replicates(scores, gold, metric: str, resamples: int = 1000, seed: int = 0, groups=None,
               counts=None) -> np.ndarray:
    """The metric on bootstrap resamples of the items: [R] float64 (NaN where undefined).

    scores, gold: [n] (accuracy compares them for equality; the correlations are Spearman's rho
    or Pearson's r between them; mean is the scores' own, gold unused); ``groups`` [n] labels resample within groups (see
    :func:`resample_counts`); ``counts`` [R, n], when given, is the resamples' draw (and
    ``resamples``, ``seed`` and ``groups`` are not used). Each replicate equals scipy's
    ``spearmanr`` / ``pearsonr`` (or the plain accuracy) of the materialised resample."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
    scores, gold = np.asarray(scores, dtype=np.float64).ravel(), np.asarray(gold, dtype=np.float64).ravel()
    n = len(gold)
    if len(scores) != n or n == 0:
        raise ValueError(f"scores ({len(scores)}) and gold ({n}) must be non-empty and of one length")
    if counts is None:
        counts = resample_counts(n, resamples, np.random.default_rng(seed), groups)
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.shape[1] != n or not np.issubdtype(counts.dtype, np.integer):
        raise ValueError(f"counts must be integers of shape (resamples, {n}), not {counts.dtype} {counts.shape}")
    counts = counts.astype(np.int64, copy=False)  # the rank sums below need 64 bits
    total = counts.sum(axis=1)
    if metric == "accuracy":
        return counts @ (scores == gold).astype(np.float64) / total
    if metric == "mean":
        return counts @ scores / total
    if not (np.isfinite(scores).all() and np.isfinite(gold).all()):
        return np.full(len(counts), np.nan)  # as scipy's default nan_policy='propagate'
    if metric == "spearman":
        if total.max() >= 2 ** 20:
            raise ValueError(f"spearman: {total.max()} draws in a resample; the exact rank sums allow under 2^20")
        return _spearman(scores, gold, counts, total)
    # Centred on the full-sample means first, so the moments lose no digits to cancellation.
    r = _weighted_correlation(scores - scores.mean(), gold - gold.mean(), counts, total)
    r[_constant(scores, counts, total) | _constant(gold, counts, total)] = np.nan
    return r


def percentile_interval(values, level: float = 0.95) -> list[float]:
    """[lo, hi]: the (1 - level) / 2 and (1 + level) / 2 percentiles of the defined (finite)
    ``values`` [R]; [nan, nan] when none is."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), not {level}")
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return [float("nan"), float("nan")]
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return [float(lo), float(hi)]


def interval(scores, gold, metric: str, resamples: int = 1000, seed: int = 0, groups=None,
             level: float = 0.95) -> list[float]:
    """[lo, hi]: the percentile bootstrap interval of the metric (scores [n], gold [n], groups [n]
    as in :func:`replicates`), at ``level``."""
    return percentile_interval(replicates(scores, gold, metric, resamples, seed, groups), level)


def _arrays(runs: list, gold) -> tuple[list, np.ndarray]:
    """Checks and converts ``runs`` (a list of rows, each a list of per-seed score arrays [n]) and gold [n]."""
    gold = np.asarray(gold, dtype=np.float64).ravel()
    k = len(runs[0])
    if k == 0 or any(len(row) != k for row in runs):
        raise ValueError(f"every row needs the same number (>= 1) of seeds, not {[len(row) for row in runs]}")
    runs = [[np.asarray(s, dtype=np.float64).ravel() for s in row] for row in runs]
    lengths = {len(s) for row in runs for s in row}
    if lengths != {len(gold)}:
        raise ValueError(f"every score array must have the {len(gold)} items of gold, not {sorted(lengths)}")
    return runs, gold


def seed_replicates(runs: list, gold, metric: str, groups=None, resamples: int = 2000, seed: int = 0) -> np.ndarray:
    """A hierarchical bootstrap over seeds and items, shared by several rows: [len(runs), R].

    ``runs``: one entry per row, each a list of k score arrays [n] (one per seed: the same k seeds,
    in the same order, for every row) over the same items (``gold`` [n], ``groups`` [n] optional).
    Each replicate draws k seeds with replacement and one resample of the items (within groups),
    and gives every row the mean, over the k drawn seeds, of its metric on that resample. One item
    resample serves all the drawn seeds: every seed was evaluated on the same items, so the items'
    sampling noise is shared by them, not averaged away (drawing a resample per seed would make the
    interval too narrow by up to sqrt(k)). The draws are the same for every row, so rows compared
    replicate by replicate are paired."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    runs, gold = _arrays(runs, gold)
    k, n = len(runs[0]), len(gold)
    rng = np.random.default_rng(seed)
    block = max(1, 4_000_000 // n)  # replicates in blocks of about 4M counts (memory)
    out = []
    for start in range(0, resamples, block):
        m = min(block, resamples - start)
        drawn = rng.integers(0, k, size=(m, k))  # replicate r's k seeds
        counts = resample_counts(n, m, rng, groups)
        columns = np.arange(m)[:, None]
        # every seed's metric on every resample [k, m], then each replicate's drawn seeds averaged
        out.append(np.stack([np.stack([replicates(scores, gold, metric, counts=counts) for scores in row])[drawn, columns]
                             .mean(axis=1) for row in runs]))
    return np.concatenate(out, axis=1)


def seeds_interval(per_seed: list, gold, metric: str, groups=None, resamples: int = 2000, seed: int = 0,
                   level: float = 0.95) -> list[float]:
    """[lo, hi]: the interval of a row's metric averaged over its seeds (``per_seed``: k score
    arrays [n]), from the hierarchical bootstrap of :func:`seed_replicates`. With one seed it is
    the items' percentile interval; with several it also holds the spread between seeds."""
    return percentile_interval(seed_replicates([per_seed], gold, metric, groups, resamples, seed)[0], level)


def paired_difference(a: list, b: list, gold, metric: str, groups=None, resamples: int = 2000, seed: int = 0,
                      level: float = 0.95) -> dict:
    """Is metric(a) - metric(b) above zero, below it, or undecided, over seeds and items?

    ``a``, ``b``: one score array [n] per seed (the same k >= 1 seeds, in the same order) over
    the same items (``gold`` [n], ``groups`` [n] optional). A paired, hierarchical bootstrap
    (:func:`seed_replicates`): each replicate draws k seeds with replacement and one resample of
    the items (within groups); it averages metric(a[s]) - metric(b[s]) over the k drawn seeds, a and
    b on the same resample. Returns {"mean_difference": the mean over
    seeds of metric(a[s]) - metric(b[s]) on all the items, "ci95": [lo, hi] (the percentile
    interval at ``level``), "seeds": k, "verdict": "supported" (lo > 0), "contradicted" (hi < 0)
    or "inconclusive"}."""
    if len(a) != len(b):
        raise ValueError(f"a and b need the same number (>= 1) of seeds, not {len(a)} and {len(b)}")
    if len(a) == 0:
        raise ValueError("a and b need the same number (>= 1) of seeds, not 0 and 0")
    (a, b), gold = _arrays([a, b], gold)
    whole = np.ones((1, len(gold)), dtype=np.int64)
    per_seed = [replicates(x, gold, metric, counts=whole)[0] - replicates(y, gold, metric, counts=whole)[0]
                for x, y in zip(a, b)]
    ra, rb = seed_replicates([a, b], gold, metric, groups, resamples, seed)
    lo, hi = percentile_interval(ra - rb, level)
    verdict = "supported" if lo > 0 else "contradicted" if hi < 0 else "inconclusive"
    return {"mean_difference": float(np.mean(per_seed)), "ci95": [lo, hi], "seeds": len(a), "verdict": verdict}
