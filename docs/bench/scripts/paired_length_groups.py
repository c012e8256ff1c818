"""Paired: minBERT's training steps on the CPU (fp32) with attention over length groups of sentences
(``attend_by_length = True``, the CPU's default) against one group padded to the batch's width
(``False``, what a GPU runs when flash varlen cannot), alternating in one process; median of the
timed steps of each. Usage: PYTHONPATH=. python docs/bench/scripts/paired_length_groups.py /tmp/minilm
"""
import statistics
import sys
import time

import torch

from bertcf import bench

mb, _, _ = bench.load_models(sys.argv[1])
for workload in (bench.Multitask, bench.Mirror):
    w = workload(workload.__name__.lower(), mb.config, torch.device("cpu"), "fp32", 4, 11713)
    step = w.build(bench.Encoder(mb))
    times = {True: [], False: []}
    for i in range(10):
        for by_length in ((True, False) if i % 2 == 0 else (False, True)):
            mb.attend_by_length = by_length
            start = time.perf_counter()
            step(w.batches[i % 4])
            if i >= 2:
                times[by_length].append(time.perf_counter() - start)
    print(w.name, {("length groups" if k else "one group"): round(1e3 * statistics.median(v), 1)
                   for k, v in times.items()})
