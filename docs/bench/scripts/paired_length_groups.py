"""Paired: minBERT's training steps with attention over length groups of sentences
(``attend_by_length = True``, the CPU's default) against one group padded to the batch's width
(``False``, what a GPU runs when flash varlen cannot), alternating in one process; median of the
timed steps of each. fp32 on the CPU, bf16 on a GPU (where length groups cost a host sync per
forward and launches per group: the open question). Usage:

    PYTHONPATH=. python docs/bench/scripts/paired_length_groups.py /tmp/minilm [cpu|cuda]
"""
import statistics
import sys
import time

import torch

from bertcf import bench

device = torch.device(sys.argv[2] if len(sys.argv) > 2 else "cpu")
mb, _, _ = bench.load_models(sys.argv[1])
mb.to(device)
for workload in (bench.Multitask, bench.Mirror):
    w = workload(workload.__name__.lower(), mb.config, device, "fp32" if device.type == "cpu" else "bf16", 4, 11713)
    step = w.build(bench.Encoder(mb))
    times = {True: [], False: []}
    for i in range(10):
        for by_length in ((True, False) if i % 2 == 0 else (False, True)):
            mb.attend_by_length = by_length
            bench._sync(device)
            start = time.perf_counter()
            step(w.batches[i % 4])
            bench._sync(device)
            if i >= 2:
                times[by_length].append(time.perf_counter() - start)
    print(w.name, {("length groups" if k else "one group"): round(1e3 * statistics.median(v), 1)
                   for k, v in times.items()})
