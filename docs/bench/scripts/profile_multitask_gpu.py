"""The script that took the H100 profile in docs/BENCHMARKS.md (kept as it ran, on 2026-11-22):
minBERT's multitask step (bench workload) at bert-base size, bf16, uncompiled; 6 warm-up steps, then
torch.profiler over 3 steps. Run from the repository root on a GPU machine:

    PYTHONPATH=. python docs/bench/scripts/profile_multitask_gpu.py

Its last line sums self_device_time_total over every row and so counts kernels twice (52.03 ms
printed); BENCHMARKS.md quotes the table's own "Self CUDA time total" (76.1 ms over 3 steps)."""
import sys
import time

import torch

from bertcf.bench.models import Encoder, load_models
from bertcf.bench.workloads import Multitask

compile_ = "--compile" in sys.argv
mb, hf, note = load_models("bert-base-uncased")
dev = torch.device("cuda")
enc = Encoder(mb.to(dev), compile_)
w = Multitask("multitask", mb.config, dev, "bf16", 8, 11711)
step = w.build(enc)
for i in range(6):
    step(w.batches[i % 8])
torch.cuda.synchronize()
# CPU-side time to issue one step vs GPU time
t0 = time.perf_counter(); step(w.batches[0]); t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
print(f"issue {1e3*(t1-t0):.2f} ms, until done {1e3*(t2-t0):.2f} ms")
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for i in range(3):
        step(w.batches[i])
    torch.cuda.synchronize()
ka = prof.key_averages()
print(ka.table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))
gpu_total = sum(e.self_device_time_total for e in ka) / 3 / 1e3
print(f"GPU busy per step (sum of kernel times): {gpu_total:.2f} ms; kernels per step: "
      f"{sum(e.count for e in ka if e.device_type.name == 'CUDA') / 3:.0f}")
