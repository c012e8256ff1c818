"""Paired, on the CPU: minBERT's training steps with attention over length groups of sentences
(``attend_by_length = True``, the CPU's default) against one group padded to the batch's width
(``False``), alternating in one process; median of the timed steps of each; fp32. (On a GPU, see
paired_attention_gpu.py, which also times these two routes against flash attention.) Usage:

    PYTHONPATH=. python docs/bench/scripts/paired_length_groups.py /tmp/minilm
"""
import statistics
import sys
import time

import torch

from bertcf.bench.models import Encoder, load_models
from bertcf.bench.timing import _sync
from bertcf.bench.workloads import Mirror, Multitask

device = torch.device("cpu")
mb, _, _ = load_models(sys.argv[1])
mb.to(device)
for workload in (Multitask, Mirror):
    w = workload(workload.__name__.lower(), mb.config, device, "fp32", 4, 11713)
    step = w.build(Encoder(mb))
    times = {True: [], False: []}
    for i in range(10):
        for by_length in ((True, False) if i % 2 == 0 else (False, True)):
            mb.attend_by_length = by_length
            _sync(device)
            start = time.perf_counter()
            step(w.batches[i % 4])
            _sync(device)
            if i >= 2:
                times[by_length].append(time.perf_counter() - start)
    print(w.name, {("length groups" if k else "one group"): round(1e3 * statistics.median(v), 1)
                   for k, v in times.items()})
