"""bertcf.evaluation.bootstrap: the count-weighted metrics against scipy on materialised resamples, the
stratified draw, the intervals' coverage where the answer is known, the paired bootstrap's
verdicts, and the CS224N STS dev evaluator's interval."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from bertcf.evaluation.bootstrap import (
    interval,
    paired_difference,
    percentile_interval,
    replicates,
    resample_counts,
    seed_replicates,
    seeds_interval,
)


def sts_like(n: int, rng: np.random.Generator, decimals: int | None = 1) -> tuple[np.ndarray, np.ndarray]:
    """(scores, gold): gold on STS's scale with many ties (0 to 5 in steps of 0.2), scores a
    noisy copy, rounded to ``decimals`` (many ties among them too) unless None (no ties)."""
    gold = rng.integers(0, 26, size=n) / 5
    scores = gold + rng.normal(size=n)
    return (scores if decimals is None else np.round(scores, decimals)), gold


def reference(metric: str, scores, gold) -> float:
    if metric == "spearman":
        return stats.spearmanr(scores, gold).statistic
    if metric == "pearson":
        return stats.pearsonr(scores, gold).statistic
    return float(np.mean(scores == gold))


@pytest.mark.parametrize("metric, decimals", [("spearman", 1), ("spearman", None), ("pearson", 1), ("accuracy", 1)])
@pytest.mark.parametrize("grouped", [False, True])
def test_replicates_equal_scipy_on_the_materialised_resamples(metric, decimals, grouped):
    rng = np.random.default_rng(1)
    scores, gold = sts_like(80, rng, decimals)
    assert (len(set(scores)) < 60) == (decimals is not None)  # ties among the scores, or none
    if metric == "accuracy":  # class labels: right about half the time
        gold, scores = rng.integers(0, 3, size=80), rng.integers(0, 3, size=80)
    groups = np.repeat(["MSRpar", "MSRvid", "OnWN"], [20, 25, 35]) if grouped else None
    counts = resample_counts(80, 40, np.random.default_rng(2), groups)
    ours = replicates(scores, gold, metric, counts=counts)
    for r in range(40):
        drawn = np.repeat(np.arange(80), counts[r])  # the resample itself: duplicates and all
        assert ours[r] == pytest.approx(reference(metric, scores[drawn], gold[drawn]), abs=1e-12)
    # Without counts: the draw of the seed, the same values.
    assert np.array_equal(replicates(scores, gold, metric, resamples=40, seed=2, groups=groups), ours)


def test_replicates_of_all_the_items_are_the_metric():
    scores, gold = sts_like(50, np.random.default_rng(3))
    whole = np.ones((1, 50), dtype=int)
    for metric in ("spearman", "pearson"):
        assert replicates(scores, gold, metric, counts=whole)[0] == pytest.approx(reference(metric, scores, gold),
                                                                                abs=1e-12)


def test_undefined_resamples_are_nan_and_left_out_of_the_interval():
    scores, gold = sts_like(6, np.random.default_rng(4))
    counts = np.array([[6, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 3, 0, 0, 3, 0]])
    gold[[1, 4]] = 2.0  # the third resample: two items of one gold value
    for metric in ("spearman", "pearson"):
        r = replicates(scores, gold, metric, counts=counts)
        assert math.isnan(r[0]) and math.isnan(r[2]) and r[1] == pytest.approx(reference(metric, scores, gold))
        assert percentile_interval(r) == [pytest.approx(r[1])] * 2
    assert all(math.isnan(v) for v in percentile_interval([math.nan, math.nan]))
    assert all(math.isnan(v) for v in interval([0.1, math.nan, 0.3], [1, 2, 3], "spearman", resamples=5))


def test_stratified_counts_keep_every_group_size():
    groups = np.array(list("aabbbbbcccccccccc") * 3)  # 51 items in three groups, interleaved
    counts = resample_counts(len(groups), 500, np.random.default_rng(0), groups)
    assert counts.shape == (500, 51) and (counts >= 0).all()
    for g in "abc":
        assert (counts[:, groups == g].sum(axis=1) == (groups == g).sum()).all()
    # Within its group every item is equally likely: about one draw each on average.
    assert np.abs(counts.mean(axis=0) - 1).max() < 0.2
    plain = resample_counts(51, 500, np.random.default_rng(0))
    assert (plain.sum(axis=1) == 51).all() and not (plain[:, groups == "a"].sum(axis=1) == 6).all()


def test_same_seed_same_interval_other_seed_another():
    scores, gold = sts_like(200, np.random.default_rng(5))
    assert interval(scores, gold, "spearman", seed=7) == interval(scores, gold, "spearman", seed=7)
    assert interval(scores, gold, "spearman", seed=7) != interval(scores, gold, "spearman", seed=8)
    values = replicates(scores, gold, "spearman", seed=7)
    assert interval(scores, gold, "spearman", seed=7, level=0.9) == \
        [pytest.approx(np.percentile(values, 5)), pytest.approx(np.percentile(values, 95))]


def test_coverage_of_the_spearman_interval_where_the_answer_is_known():
    """Bivariate normal with correlation r: Spearman's rho is 6/pi asin(r/2) (Pearson 1907).
    150 simulated sets of 300 pairs: the 95% interval holds it about 95% of the time."""
    r, sets, n = 0.6, 150, 300
    truth = 6 / math.pi * math.asin(r / 2)
    rng = np.random.default_rng(11)
    covered = 0
    for k in range(sets):
        x, e = rng.normal(size=(2, n))
        lo, hi = interval(x, r * x + math.sqrt(1 - r * r) * e, "spearman", resamples=1000, seed=k)
        covered += lo <= truth <= hi
    assert 0.90 <= covered / sets <= 0.99, covered / sets


def _seeds(rng, gold, noise: float, k: int) -> list[np.ndarray]:
    """k seeds' scores: gold plus independent noise of scale ``noise``."""
    return [gold + noise * rng.normal(size=len(gold)) for _ in range(k)]


def test_paired_difference_finds_a_planted_difference():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 26, size=400) / 5
    groups = np.repeat(["x", "y"], 200)
    a = _seeds(rng, gold, 1.0, 3)
    b = [s + 1.5 * rng.normal(size=400) for s in a]  # a's scores made worse
    result = paired_difference(a, b, gold, "spearman", groups=groups, resamples=500)
    expected = np.mean([stats.spearmanr(x, gold).statistic - stats.spearmanr(y, gold).statistic
                        for x, y in zip(a, b)])
    assert result["mean_difference"] == pytest.approx(expected, abs=1e-12)
    assert result["verdict"] == "supported" and 0 < result["ci95"][0] < expected < result["ci95"][1]
    assert result["seeds"] == 3
    swapped = paired_difference(b, a, gold, "spearman", groups=groups, resamples=500)
    assert swapped["verdict"] == "contradicted" and swapped["mean_difference"] == pytest.approx(-expected)
    # Paired: a and b are scored on the same resample, so scores of one ranking differ by 0 in every one.
    same = paired_difference(a, [2 * s + 1 for s in a], gold, "spearman", groups=groups, resamples=500)
    assert same["ci95"] == [0.0, 0.0] and same["verdict"] == "inconclusive"
    # Deterministic, and a single seed is enough to run.
    assert paired_difference(a, b, gold, "spearman", groups=groups, resamples=500) == result
    assert paired_difference(a[:1], b[:1], gold, "pearson", resamples=200)["seeds"] == 1


def test_paired_difference_calls_a_zero_difference_inconclusive_at_about_the_nominal_rate():
    rng = np.random.default_rng(1)
    verdicts = []
    for case in range(100):
        gold = rng.integers(0, 26, size=150) / 5
        a, b = _seeds(rng, gold, 1.5, 3), _seeds(rng, gold, 1.5, 3)  # one distribution, independent noise
        verdicts.append(paired_difference(a, b, gold, "spearman", resamples=400, seed=case)["verdict"])
    decided = sum(v != "inconclusive" for v in verdicts)
    assert decided <= 15, verdicts


@pytest.mark.parametrize("a, b, gold, metric, message", [
    ([[1, 2, 3]], [[1, 2, 3], [3, 2, 1]], [1, 2, 3], "spearman", "same number"),
    ([], [], [1, 2, 3], "spearman", "same number"),
    ([[1, 2, 3]], [[1, 2]], [1, 2, 3], "spearman", "items of gold"),
    ([[1, 2, 3]], [[1, 2, 3]], [1, 2, 3], "kendall", "unknown metric"),
])
def test_paired_difference_rejects_bad_input(a, b, gold, metric, message):
    with pytest.raises(ValueError, match=message):
        paired_difference(a, b, gold, metric)


def test_bad_input_to_the_resampling():
    with pytest.raises(ValueError, match="unknown metric"):
        replicates([1, 2], [1, 2], "r2")
    with pytest.raises(ValueError, match="one length"):
        interval([1, 2, 3], [1, 2], "pearson")
    with pytest.raises(ValueError, match="counts must be integers of shape"):
        replicates([1, 2, 3], [1, 2, 3], "spearman", counts=np.ones((4, 3)))
    with pytest.raises(ValueError, match="groups has shape"):
        resample_counts(3, 10, np.random.default_rng(0), groups=["a", "b"])
    with pytest.raises(ValueError, match="level"):
        percentile_interval([1.0, 2.0], level=95)


def test_sts_dev_evaluator_reports_its_interval(tiny_bert_dir, cs224n_dir):
    from bertcf import SentenceEncoder
    from bertcf.data.tasks import read_sts, task_file
    from bertcf.evaluation.metrics import STSDevEvaluator

    pairs = read_sts(task_file(cs224n_dir, "sts", "dev"))
    result = STSDevEvaluator(pairs)(SentenceEncoder.from_pretrained(tiny_bert_dir))
    lo, hi = result["sts_spearman_ci95"]
    assert lo <= result["sts_spearman"] <= hi and lo < hi
    assert [lo, hi] == interval(result["cosines"], [p.label for p in pairs], "spearman", 1000, seed=0)


def test_seed_replicates_pair_the_rows_and_widen_with_the_spread_between_seeds():
    rng = np.random.default_rng(5)
    gold = rng.normal(size=400)
    runs = [gold + rng.normal(scale=1.0, size=400) for _ in range(3)]
    # The same draws for every row: a row given twice gets identical replicates.
    twice = seed_replicates([runs, runs], gold, "spearman", resamples=300, seed=1)
    assert np.array_equal(twice[0], twice[1])
    # One seed: the items' interval (another stream of draws, so equal within bootstrap noise).
    one = seeds_interval(runs[:1], gold, "spearman", resamples=2000, seed=2)
    items = interval(runs[0], gold, "spearman", resamples=2000, seed=3)
    assert one == pytest.approx(items, abs=0.02)
    # Seeds that differ: the interval holds the spread between them, so it is wider than any
    # one seed's and contains the mean over seeds.
    spread = [gold + rng.normal(scale=s, size=400) for s in (0.5, 1.0, 2.0)]
    lo, hi = seeds_interval(spread, gold, "spearman", resamples=2000, seed=4)
    mean = np.mean([stats.spearmanr(x, gold).statistic for x in spread])
    assert lo <= mean <= hi
    assert hi - lo > max(np.subtract(*interval(x, gold, "spearman", resamples=2000, seed=5)[::-1]) for x in spread)


def test_seeds_scored_on_the_same_pairs_share_the_pairs_noise():
    """k identical seeds are one seed evaluated k times on the same pairs: the pairs' noise does not
    average away, so the interval is as wide as one seed's (a resample per seed would shrink it by
    about sqrt(k))."""
    rng = np.random.default_rng(7)
    gold = rng.normal(size=500)
    scores = gold + rng.normal(scale=1.5, size=500)
    one = seeds_interval([scores], gold, "spearman", resamples=3000, seed=1)
    three = seeds_interval([scores] * 3, gold, "spearman", resamples=3000, seed=1)
    assert (three[1] - three[0]) == pytest.approx(one[1] - one[0], rel=0.1)
