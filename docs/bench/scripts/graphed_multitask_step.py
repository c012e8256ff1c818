"""How much of minBERT's multitask training step is the host's: the same step (bench's
Multitask workload: MultitaskModel, the heads' losses and StepMethods, bf16, AdamW made capturable) run eagerly and
replayed from one CUDA graph captured on one fixed batch, which leaves only the kernels. Not a
training mode: a graph replays fixed shapes, and every real batch has its own number of tokens.
bert-base-uncased's config with random weights. Usage:

    PYTHONPATH=. python docs/bench/scripts/graphed_multitask_step.py
"""
import statistics

import torch

import bertcf.training
from bertcf.bench.models import Encoder, load_models
from bertcf.bench.timing import peak_flops
from bertcf.bench.workloads import Multitask

device = torch.device("cuda")
mb, _, note = load_models("bert-base-uncased")
mb.to(device)
print(torch.cuda.get_device_name(), torch.__version__, note)


def capturable_adamw(params, lr, weight_decay, device):
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, weight_decay=weight_decay,
                             fused=True, capturable=True)


bertcf.training.make_optimizer = capturable_adamw
w = Multitask("multitask", mb.config, device, "bf16", 1, 11713)
(batch,) = w.batches
step = w.build(Encoder(mb))
flops = w.flops(batch)
peak = peak_flops(device, "bf16")


def timed(fn, n=30):
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        step(batch)
torch.cuda.current_stream().wait_stream(side)
eager = timed(lambda: step(batch))
print(f"eager: {eager:.2f} ms  MFU {100 * flops / (eager / 1e3) / peak:.1f}%  ({w.real_tokens(batch)} tokens)")
graph = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(graph):
        loss = step(batch)
except Exception as e:  # report what cannot be captured rather than stop
    print("capture failed:", str(e).splitlines()[0])
else:
    replay = timed(graph.replay)
    print(f"graph replay: {replay:.2f} ms  MFU {100 * flops / (replay / 1e3) / peak:.1f}%  loss {loss.item():.4f}")
