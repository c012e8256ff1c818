"""Paired, on a GPU in bf16: minBERT's multitask and mirror training steps with attention over
the packed sentences through the flash kernel (``flash_attention``, the default), through the
memory-efficient kernel (``_efficient_attention_forward``, which also takes dropout), as
``scaled_dot_product_attention`` over one group padded to the batch's width (what a GPU ran
before), and over length groups (the CPU's route). The four alternate in one process (order
rotated each round); median of the timed steps of each. bert-base-uncased's config with random
weights unless a checkpoint is given. Usage:

    PYTHONPATH=. python docs/bench/scripts/paired_attention_gpu.py [checkpoint]
"""
import statistics
import sys
import time

import torch

import minbert.model
from bertcf.bench.models import Encoder, load_models
from bertcf.bench.workloads import Mirror, Multitask

flash, runs = minbert.model.flash_attention, minbert.model.flash_attention_runs


def efficient(q, k, v, cu_seqlens, max_len, dropout_p):
    need_lse = torch.is_grad_enabled() and q.requires_grad  # the backward needs the log-sum-exp
    return torch.ops.aten._efficient_attention_forward(q[None], k[None], v[None], None, cu_seqlens, cu_seqlens,
                                                       max_len, max_len, dropout_p, 0, need_lse)[0][0]


def never(*args):
    return False


device = torch.device("cuda")
mb, _, note = load_models(sys.argv[1] if len(sys.argv) > 1 else "bert-base-uncased")
print(torch.cuda.get_device_name(), torch.__version__, note)
mb.to(device)
routes = {"varlen, memory-efficient": (efficient, runs, None), "varlen, flash": (flash, runs, None),
          "one padded group": (flash, never, False), "length groups": (flash, never, True)}
names = list(routes)
for workload in (Multitask, Mirror):
    w = workload(workload.__name__.lower(), mb.config, device, "bf16", 4, 11713)
    step = w.build(Encoder(mb))
    times = {name: [] for name in routes}
    for i in range(24):
        for name in names[i % 4:] + names[:i % 4]:
            minbert.model.flash_attention, minbert.model.flash_attention_runs, mb.attend_by_length = routes[name]
            torch.cuda.synchronize()
            start = time.perf_counter()
            step(w.batches[i % 4])
            torch.cuda.synchronize()
            if i >= 4:
                times[name].append(time.perf_counter() - start)
    print(w.name, {name: round(1e3 * statistics.median(v), 2) for name, v in times.items()}, flush=True)
