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


def layer_linears(config) -> dict:
    """The Linear layers of one BERT layer, by name: (inputs, outputs)."""
    d, i = config.hidden_size, config.intermediate_size
    return {"attention.self.query": (d, d), "attention.self.key": (d, d), "attention.self.value": (d, d),
            "attention.output.dense": (d, d), "intermediate.dense": (d, i), "output.dense": (i, d)}


def adapted_encoder_flops(config, lengths, settings, adapters: int = 1, passes: int = 1) -> float:
    """Training FLOPs of an encoder whose weights are frozen, with peft adapters (``settings``, a
    ``models.peft.PeftSettings``; ``adapters`` active on every row: 2 with one per task), over
    sentences of these real lengths in ``passes`` encoder passes: what its matrix products do.

    Each frozen weight: its forward and its input's gradient (4 per weight and token; no weight
    gradient), but for the first layer's query, key and value, whose input (the frozen embeddings)
    needs no gradient; attention 12 L d t^2, less the first layer's products that lead to a
    projection without an adapter only. LoRA and DoRA: their A and B, 6 per weight and token, A's
    input gradient again not in the first layer's query, key and value; DoRA also forms B A once a
    pass (peft: ``lora_B(lora_A(eye))``, 2 r in (in + out) a layer, its weight norm detached). IA3's
    vectors only scale (no matrix product). Assumes what every default target set gives: some of the
    first layer's query, key and value adapted, so everything above them needs input gradients."""
    if settings.peft == "houlsby":
        return houlsby_encoder_flops(config, lengths, settings.peft_bottleneck, adapters)
    d, layers = config.hidden_size, config.num_hidden_layers
    shapes = layer_linears(config)
    adapted = {name for name in shapes for t in settings.target_modules if name == t or name.endswith("." + t)}
    qkv = [f"attention.self.{n}" for n in ("query", "key", "value")]
    if not adapted & set(qkv):
        raise ValueError("adapted_encoder_flops: the first layer's query, key or value must carry an adapter")
    weights = layers * sum(a * b for a, b in shapes.values())
    # the first layer's attention backward: dQ and dK where adapted, dP where either is, dV where adapted
    q, k, v = (name in adapted for name in qkv)
    skipped = 2 * d * ((not q) + (not k) + (not (q or k)) + (not v))
    tokens = sum(lengths)
    flops = (4 * weights - 2 * 3 * d * d) * tokens + sum((12 * layers * d - skipped) * t * t for t in lengths)
    if settings.peft in ("lora", "dora"):
        r = settings.peft_rank
        per_token = 6 * r * layers * sum(a + b for n, (a, b) in shapes.items() if n in adapted)
        per_token -= 2 * r * sum(shapes[n][0] for n in qkv if n in adapted)  # the first layer's A: no input gradient
        flops += adapters * per_token * tokens
        if settings.peft == "dora":
            per_pass = layers * sum(2 * r * a * (a + b) for n, (a, b) in shapes.items() if n in adapted)
            flops += adapters * passes * per_pass
    return flops


def houlsby_encoder_flops(config, lengths, bottleneck: int, adapters: int = 1) -> float:
    """Training FLOPs of a frozen encoder with Houlsby's bottleneck adapters (``--peft houlsby``, m =
    ``bottleneck``) after each layer's attention and feed-forward output, ``adapters`` of them at each
    place: the frozen weights' forward and input gradients everywhere (the embeddings' LayerNorm is
    trained, so every layer passes gradients down), attention 12 L d t^2, each adapter's W_down and
    W_up 6 per weight and token."""
    d, layers = config.hidden_size, config.num_hidden_layers
    weights = layers * sum(a * b for a, b in layer_linears(config).values())
    tokens = sum(lengths)
    flops = 4 * weights * tokens + sum(12 * layers * d * t * t for t in lengths)
    return flops + adapters * 2 * layers * 6 * (2 * d * bottleneck) * tokens


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


def cpu_step_peak(step, inputs) -> int:
    """The most bytes of tensors that one ``step(inputs)`` allocated through torch's CPU allocator
    and held at once: torch.profiler's memory events (``profile_memory``), whose running total
    counts the blocks allocated while it profiles, less those freed. Blocks allocated before (the
    weights, AdamW's state, the inputs) are not in it; what the step frees of them is ignored."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(inputs)
    events, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        e = todo.pop()
        todo += e.children
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append(e.extra_fields)
    if not events:
        return 0
    # the total before the step: the lowest before any event (freeing the step's own blocks never goes below it)
    start = min(e.total_allocated - e.alloc_size for e in events)
    return max(e.total_allocated for e in events) - start


def tensor_bytes(tensors) -> int:
    """The bytes of these tensors' storages, each storage once."""
    seen = {}
    for t in tensors:
        if t.device.type != "meta":
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def step_memory(step, inputs, device) -> dict:
    """One more step of a built workload (``step.module``, ``step.optimizer``: what it trains and
    with what), untimed, measured: the parameters it trains (``trainable_params``), AdamW's state
    after it (``optimizer_state_bytes``: its tensors' nbytes), the model's weights and buffers
    (``weights_bytes``), the step's peak (``step_peak_bytes``: the most tensor memory it held at once
    beyond what was held when it started: gradients, activations, temporaries) and their sum
    ``peak_bytes``, the step's peak for this model alone (its inputs aside). The gradients of the
    step before are dropped first (the step's first act), so that they count as the step's own. On a
    GPU ``torch.cuda.max_memory_allocated`` less the allocated memory at the start
    (``device_peak_bytes``: the maximum as it is, all that the process holds on the device); on the
    CPU torch.profiler's accounting of the CPU allocator (:func:`cpu_step_peak`)."""
    opt, module = getattr(step, "optimizer", None), getattr(step, "module", None)
    if opt is not None:
        opt.zero_grad(set_to_none=True)
    out = {"device_peak_bytes": None}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        step(inputs)
        torch.cuda.synchronize(device)
        out["device_peak_bytes"] = torch.cuda.max_memory_allocated(device)
        out["step_peak_bytes"] = out["device_peak_bytes"] - start
    else:
        out["step_peak_bytes"] = cpu_step_peak(step, inputs)
    trained = [] if opt is None else [p for group in opt.param_groups for p in group["params"]]
    out["trainable_params"] = sum(p.numel() for p in trained) if opt is not None else None
    out["optimizer_state_bytes"] = (None if opt is None else
                                    tensor_bytes(v for state in opt.state.values() for v in state.values()
                                                 if torch.is_tensor(v)))
    out["weights_bytes"] = None if module is None else tensor_bytes([*module.parameters(), *module.buffers(),
                                                                     *trained])
    out["peak_bytes"] = (None if module is None else
                         out["weights_bytes"] + (out["optimizer_state_bytes"] or 0) + out["step_peak_bytes"])
    return out


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
    # the memory on the pool's input with the most tokens (for every variant of a pool the same one)
    largest = max(pool, key=workload.real_tokens)
    for name in names:
        result[name] |= step_memory(steps_fns[name], largest, device)
    if len(names) == 2:
        result["speedup"] = result[names[1]]["ms_per_step"] / result[names[0]]["ms_per_step"]
    if profile:
        result["profile"] = profile_step(steps_fns[names[0]], [pool[i % len(pool)] for i in range(profile)], device)
    return result
