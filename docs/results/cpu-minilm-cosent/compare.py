"""CoSENT and AnglE against SBERT's cosine regression (issue 49), over the seeds run.sh trained.

Each run's last checkpoint encodes CS224N STS dev and SentEval's STS-B test; a pair's score is the
cosine of its two vectors. Per set: every method's Spearman ×100 (mean and interval over seeds and
pairs) and the three comparisons as paired differences (bertcf.evaluation.bootstrap, the project's
seeds-and-items bootstrap): CoSENT's and AnglE's papers claim each beats the one before it.
Usage: python compare.py RUNS_DIR CS224N_DIR SENTEVAL_DIR OUT.json  (RUNS_DIR: run.sh's OUT)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from bertcf import SentenceEncoder
from bertcf.data.senteval import STSB_FILES, read_stsb
from bertcf.data.tasks import read_task
from bertcf.evaluation import bootstrap

METHODS = ("sbert-cosine", "cosent", "angle")
SEEDS = (11711, 1, 2)
CLAIMS = (("cosent", "sbert-cosine"), ("angle", "cosent"), ("angle", "sbert-cosine"))


def cosines(encoder, pairs) -> np.ndarray:
    a = encoder.encode([p.sentence1 for p in pairs], batch_size=64).double().numpy()
    b = encoder.encode([p.sentence2 for p in pairs], batch_size=64).double().numpy()
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main(runs_dir, data_dir, senteval_dir, out) -> None:
    sets = {"cs224n-sts-dev": read_task(data_dir, "sts", "dev"),
            "stsb-test": read_stsb(Path(senteval_dir) / STSB_FILES["test"])}
    scores = {name: {m: [] for m in METHODS} for name in sets}
    for method in METHODS:
        for seed in SEEDS:
            encoder = SentenceEncoder.from_pretrained(Path(runs_dir) / f"{method}-{seed}" / "best").eval()
            for name, pairs in sets.items():
                scores[name][method].append(cosines(encoder, pairs))
    result = {"seeds": SEEDS, "metric": "spearman x100", "sets": {}}
    for name, pairs in sets.items():
        gold = [p.label for p in pairs]
        rows = {m: {"per_seed": [100 * float(spearmanr(s, gold).statistic) for s in scores[name][m]],
                    "ci95": [100 * v for v in bootstrap.seeds_interval(scores[name][m], gold, "spearman")]}
                for m in METHODS}
        for row in rows.values():
            row["mean"] = float(np.mean(row["per_seed"]))
        claims = []
        for a, b in CLAIMS:
            test = bootstrap.paired_difference(scores[name][a], scores[name][b], gold, "spearman")
            claims.append({"a": a, "b": b, "mean_difference": 100 * test["mean_difference"],
                           "ci95": [100 * v for v in test["ci95"]], "verdict": test["verdict"]})
        result["sets"][name] = {"pairs": len(pairs), "rows": rows, "claims": claims}
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    for name, part in result["sets"].items():
        print(f"{name} ({part['pairs']} pairs)")
        for m, row in part["rows"].items():
            (lo, hi), seeds = row["ci95"], ", ".join(f"{v:.2f}" for v in row["per_seed"])
            print(f"  {m:13s} {row['mean']:.2f} [{lo:.2f}, {hi:.2f}]  seeds {seeds}")
        for c in part["claims"]:
            lo, hi = c["ci95"]
            print(f"  {c['a']} - {c['b']}: {c['mean_difference']:+.2f} [{lo:+.2f}, {hi:+.2f}] {c['verdict']}")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__.strip().splitlines()[-1])
    main(*sys.argv[1:])
