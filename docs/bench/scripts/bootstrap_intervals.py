"""What the STS intervals add to an evaluation: bertcf.bootstrap over pairs the size of SentEval's
seven STS sets (1,000 resamples each, within the subsets of STS12-16, as STSEvaluator draws them),
timed as the evaluation runs them. Also a paired, hierarchical claim test (3 seeds, 2,000 resamples)
on STS-B test's size.

    PYTHONPATH=. python docs/bench/scripts/bootstrap_intervals.py [REPEATS]
"""
import sys
import time

import numpy as np

from bertcf.data.senteval import STS_YEARS
from bertcf.evaluation import bootstrap

#: Pairs of each set in SentEval's "all" setting (STS12-16 with their subsets, STS-B test, SICK-R test).
SIZES = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186, "STSBenchmark": 1379,
         "SICKRelatedness": 4927}


def sts_like(n: int, rng):
    gold = np.round(rng.uniform(0, 5, n), 1)  # scores with ties, as the gold files have
    return gold + rng.normal(0, 1.5, n), gold


def main(repeats: int = 5):
    rng = np.random.default_rng(0)
    sets = {}
    for name, n in SIZES.items():
        scores, gold = sts_like(n, rng)
        subsets = STS_YEARS.get(name, ("all",))
        groups = np.repeat(np.arange(len(subsets)), -(-n // len(subsets)))[:n]
        sets[name] = (scores, gold, groups if len(subsets) > 1 else None)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for scores, gold, groups in sets.values():
            bootstrap.interval(scores, gold, "spearman", 1000, 0, groups)
        times.append(time.perf_counter() - start)
    print(f"seven STS sets, 1,000 resamples each: min {min(times):.2f} s, median {np.median(times):.2f} s "
          f"over {repeats} repeats")
    scores, gold, _ = sets["STSBenchmark"]
    a = [scores + rng.normal(0, 0.3, len(gold)) for _ in range(3)]
    b = [scores + rng.normal(0, 0.3, len(gold)) for _ in range(3)]
    start = time.perf_counter()
    bootstrap.paired_difference(a, b, gold, "spearman", resamples=2000)
    print(f"one claim (3 seeds, STS-B test, 2,000 resamples): {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
