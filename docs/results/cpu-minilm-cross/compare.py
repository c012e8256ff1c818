"""Paired comparisons of issue 51's pair models: the cross-encoder against the bi-encoder trained on
the same pairs, on CS224N STS dev (Spearman), QQP dev (accuracy at 0.5) and STS-B test (Spearman),
with the paired bootstrap over pairs (bertcf.evaluation.bootstrap, 2,000 resamples).
Usage: python compare.py CROSS_RUNS_DIR CS224N_DIR SENTEVAL_DIR OUT.json"""
import json
import sys
from pathlib import Path

import torch

from bertcf.evaluation.bootstrap import paired_difference
from bertcf.cross.evaluation import load_pair_model, pair_scores, pair_set_paths, read_pair_set

runs, data, senteval, out = (Path(a) for a in sys.argv[1:5])
paths = pair_set_paths(data, senteval_dir=senteval)
sets = {name: read_pair_set(name, paths[name]) for name in ("sts-dev", "qqp-dev", "stsb-test")}
metric = {"sts-dev": "spearman", "qqp-dev": "accuracy", "stsb-test": "spearman"}
result = {}
for task, (cross, bi) in {"sts": ("ce-sts", "bi-sts"), "qqp": ("ce-qqp", "bi-qqp")}.items():
    models = {name: load_pair_model(runs / name / "best") for name in (cross, bi)}
    for name, pairs in sets.items():
        gold = [p.label for p in pairs]
        with torch.inference_mode():
            scores = {m: pair_scores(model, pairs).float() for m, model in models.items()}
        if metric[name] == "accuracy":
            scores = {m: (s >= 0.5).long() for m, s in scores.items()}
        diff = paired_difference([scores[cross].numpy()], [scores[bi].numpy()], gold, metric[name])
        result[f"{cross} - {bi} on {name}"] = diff
        print(f"{cross} - {bi} on {name}: {diff['mean_difference']:+.4f} [{diff['ci95'][0]:+.4f}, "
              f"{diff['ci95'][1]:+.4f}] {diff['verdict']}")
out.write_text(json.dumps(result, indent=1) + "\n")
