"""Timing the workloads: alternating steps of both implementations, their medians, FLOPs, MFU and
the device's peak, and torch.profiler's operator table."""
from __future__ import annotations

import statistics
import time

import torch

from ..utils import environment

#: Dense tensor-core peak (TFLOP/s) in bf16/fp16 by device name; MFU is omitted elsewhere.
PEAK_TFLOPS_16BIT = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
                     ("A100", 312.0))


def encoder_flops(config, lengths, training: bool) -> float:
    """Model FLOPs of the encoder over sentences of these real lengths (no padding counted)."""
    d, L, i = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    n_layer = L * (4 * d * d + 2 * d * i)  # matmul weights per token (biases/LayerNorm negligible)
    per_token, attention = (6, 12) if training else (2, 4)
    return sum(per_token * n_layer * t + attention * L * d * t * t for t in lengths)


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense bf16/fp16 peak in FLOP/s, or None (CPU, fp32, unknown GPU)."""
    if device.type != "cuda" or precision not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS_16BIT:
        if key in name:
            return tflops * 1e12
    return None


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's with the threads torch runs on."""
    name = environment.device_name(device) or "unknown device"
    return name if device.type == "cuda" else f"{name} ({torch.get_num_threads()} threads)"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_step(step, inputs_list, device) -> dict:
    """``torch.profiler`` over one ``step`` per input: the operator table (by GPU time on a GPU,
    else by CPU time) and the GPU kernels launched per step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with profile(activities=activities) as prof:
        for inputs in inputs_list:
            step(inputs)
        _sync(device)
    averages = prof.key_averages()
    table = averages.table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=20,
                           max_name_column_width=60)
    kernels = sum(e.count for e in averages if e.device_type == DeviceType.CUDA) / len(inputs_list)
    return {"steps": len(inputs_list), "table": table, "gpu_kernels_per_step": kernels if cuda else None}


def time_workload(workload, encoders: dict, steps: int, warmup: int, profile: int = 0) -> dict:
    """Median step time of each :class:`~bertcf.bench.models.Encoder` on a
    :class:`~bertcf.bench.workloads.Workload`; their steps alternate (order flipped every round)."""
    steps_fns = {name: workload.build(bert) for name, bert in encoders.items()}
    times = {name: [] for name in encoders}
    pool = workload.batches
    names = list(encoders)
    device = workload.device
    for i in range(warmup + steps):
        inputs = pool[i % len(pool)]
        for name in (names if i % 2 == 0 else names[::-1]):
            _sync(device)
            start = time.perf_counter()
            steps_fns[name](inputs)
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    timed_inputs = [pool[i % len(pool)] for i in range(warmup, warmup + steps)]
    per_step = {"sentences": statistics.mean(workload.sentences(x) for x in timed_inputs),
                "tokens": statistics.mean(workload.real_tokens(x) for x in timed_inputs),
                "padded_tokens": statistics.mean(workload.padded_tokens(x) for x in timed_inputs),
                "flops": statistics.mean(workload.flops(x) for x in timed_inputs)}
    peak = peak_flops(device, workload.precision)
    result = {"per_step": per_step}
    for name, ts in times.items():
        median = statistics.median(ts)
        result[name] = {"ms_per_step": 1e3 * median, "tokens_per_s": per_step["tokens"] / median,
                        "sentences_per_s": per_step["sentences"] / median,
                        "tflops": per_step["flops"] / median / 1e12,
                        "mfu": per_step["flops"] / median / peak if peak else None,
                        "times_ms": [1e3 * t for t in ts]}
    if len(names) == 2:
        result["speedup"] = result[names[1]]["ms_per_step"] / result[names[0]]["ms_per_step"]
    if profile:
        result["profile"] = profile_step(steps_fns[names[0]], [pool[i % len(pool)] for i in range(profile)], device)
    return result
