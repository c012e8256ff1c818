"""Paired: the bench's minBERT mirror step on MiniLM (CPU, fp32) with torch's default AdamW (a loop
over the parameters) against fused AdamW, alternating in one process; median of 10 steps each.

    PYTHONPATH=. python docs/bench/scripts/paired_adamw_mirror.py /tmp/minilm
"""
import statistics
import sys
import time

import torch

from bertcf import training
from bertcf.bench.models import Encoder, load_models
from bertcf.bench.workloads import Mirror

mb, _, _ = load_models(sys.argv[1])
w = Mirror("mirror", mb.config, torch.device("cpu"), "fp32", 4, 11711)
make_optimizer = training.make_optimizer
steps = {}
for fused in (False, True):
    def make(params, lr, weight_decay, device, fused=fused):
        opt = make_optimizer(params, lr, weight_decay, device)
        if fused:
            return opt
        return torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups],
                                 lr=lr, fused=False)
    training.make_optimizer = make
    steps[fused] = w.build(Encoder(mb))
times = {False: [], True: []}
for i in range(12):
    for fused in ((False, True) if i % 2 == 0 else (True, False)):
        start = time.perf_counter()
        steps[fused](w.batches[i % 4])
        if i >= 2:
            times[fused].append(time.perf_counter() - start)
for fused, ts in times.items():
    print(f"fused={fused}: median {1e3 * statistics.median(ts):.1f} ms over {len(ts)} steps")
