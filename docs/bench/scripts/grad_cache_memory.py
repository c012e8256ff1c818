"""Peak memory and step time of an in-batch objective with and without --mini-batch-size (the
gradient cache of bertcf/objectives/cache.py, issue 40), each configuration in a fresh process.

    PYTHONPATH=. python docs/bench/scripts/grad_cache_memory.py MODEL [--device cpu|cuda]
        [--precision fp32|bf16] [--batches 32,64,256,512] [--mini-batch-size 32] [--steps 3] [--warmup 1]
        [--method simcse] [--negatives simcse] [--pooling cls-mlp] [--threads N] [--json OUT]

A configuration is (batch b, M or none): the whole batch at once for every b, and with
--mini-batch-size M for every b above M. Each one runs in its own Python process, since peak RSS is
a process's high-water mark: it loads MODEL (a checkpoint directory, e.g. /work/minilm), builds the
pretraining objective (bertcf.objectives, dropout 0.1, max length 32) and AdamW, and runs --warmup
then --steps optimiser steps through training.update, the Trainer's own step, on batches of b
random sentences of SimCSE-like lengths (median 24 tokens, at most 32; bertcf.bench's mirror
lengths), their views drawn inside the step as in training. It reports:

- step: the median wall time of the timed steps;
- peak RSS: the process's resident high-water mark (VmHWM), all of it: Python, torch, the model,
  gradients, AdamW's two moments, and the steps' activations;
- step memory: peak RSS minus the RSS after the model was loaded (before any step): what the
  steps added (gradients and AdamW's moments, the same in every configuration, plus activations);
- on a GPU also torch.cuda.max_memory_allocated.

Then, per row: the peak against batch 32 uncached, and the step time against the same batch
uncached; and the issue's goals: peak memory at batch 512 with M = 32 within 1.5x of batch 32's,
at no more than 1.5x batch 512's uncached step time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def rss_mib(field: str) -> float:
    """VmRSS or VmHWM of this process, MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(config: dict) -> dict:
    """One configuration, measured in this process."""
    from types import SimpleNamespace

    import torch

    from bertcf import training
    from bertcf.bench.batches import make_batch, sample_lengths, special_ids
    from bertcf.models.encoder import SentenceEncoder
    from bertcf.objectives import build_objective

    if config["threads"]:
        torch.set_num_threads(config["threads"])
    device = torch.device(config["device"])
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_pretrained(config["model"], pooling="cls" if config["pooling"] == "cls-mlp"
                                              else config["pooling"], hidden_dropout_prob=0.1,
                                              attention_probs_dropout_prob=0.1)
    settings = SimpleNamespace(negatives=config["negatives"], pooling=config["pooling"], max_length=32,
                               mini_batch_size=config["mini_batch_size"])
    objective = build_objective("mirror", config["method"], encoder, settings,
                                torch.Generator().manual_seed(0)).to(device).train()
    optimizer = training.make_optimizer(objective.parameter_groups(), 3e-5, 0.01, device)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    vocab = encoder.bert.config.vocab_size
    cls_id, sep_id, _ = special_ids(vocab)
    g = torch.Generator().manual_seed(11711)
    batches = []
    for _ in range(config["warmup"] + config["steps"]):
        b = make_batch(sample_lengths(config["batch"], 24, 32, g), vocab, g, "cpu", (cls_id, sep_id))
        batches.append((b.ids, b.mask, (b.ids == cls_id) | (b.ids == sep_id) | (b.mask == 0)))
    base = rss_mib("VmRSS")
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i, inputs in enumerate(batches):
        start = time.perf_counter()
        training.update(optimizer, scaler, lambda: objective(*inputs), device, config["precision"])
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= config["warmup"]:
            times.append(time.perf_counter() - start)
    result = {"batch": config["batch"], "mini_batch_size": config["mini_batch_size"],
              "step_ms": 1e3 * statistics.median(times), "step_times_ms": [1e3 * t for t in times],
              "peak_rss_mib": rss_mib("VmHWM"), "base_rss_mib": base}
    if device.type == "cuda":
        result["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def run_child(config: dict) -> dict:
    """``child(config)`` in a fresh Python process; its last stdout line is the JSON result."""
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(config)], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"configuration {config} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: list[dict]) -> str:
    base = next(r for r in results if r["batch"] == 32 and r["mini_batch_size"] is None)
    uncached = {r["batch"]: r for r in results if r["mini_batch_size"] is None}
    cuda = "cuda_peak_mib" in base
    lines = ["| batch | M | step ms | x uncached time | peak RSS MiB | step memory MiB | x batch 32 peak |"
             + (" CUDA peak MiB | x batch 32 CUDA |" if cuda else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|" if cuda else "")]
    for r in results:
        row = (f"| {r['batch']} | {r['mini_batch_size'] or '-'} | {r['step_ms']:.0f} | "
               f"{r['step_ms'] / uncached[r['batch']]['step_ms']:.2f} | {r['peak_rss_mib']:.0f} | "
               f"{r['peak_rss_mib'] - r['base_rss_mib']:.0f} | {r['peak_rss_mib'] / base['peak_rss_mib']:.2f} |")
        if cuda:
            row += f" {r['cuda_peak_mib']:.0f} | {r['cuda_peak_mib'] / base['cuda_peak_mib']:.2f} |"
        lines.append(row)
    return "\n".join(lines)


def goals(results: list[dict], mini: int) -> str:
    found = {(r["batch"], r["mini_batch_size"]): r for r in results}
    if not all(k in found for k in ((32, None), (512, None), (512, mini))):
        return "(the goals need batch 32 and 512, with and without the cache)"
    cached, plain, small = found[512, mini], found[512, None], found[32, None]
    memory = cached["peak_rss_mib"] / small["peak_rss_mib"]
    speed = cached["step_ms"] / plain["step_ms"]
    out = [f"peak RSS, batch 512 with M = {mini} / batch 32: {memory:.2f}x (goal <= 1.5x: "
           f"{'met' if memory <= 1.5 else 'not met'})",
           f"step time, batch 512 with M = {mini} / batch 512 uncached: {speed:.2f}x (goal <= 1.5x: "
           f"{'met' if speed <= 1.5 else 'not met'})"]
    if "cuda_peak_mib" in small:
        out.append(f"CUDA peak, batch 512 with M = {mini} / batch 32: "
                   f"{cached['cuda_peak_mib'] / small['cuda_peak_mib']:.2f}x")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="checkpoint directory (e.g. /work/minilm)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--batches", default="32,64,256,512")
    p.add_argument("--mini-batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--method", default="simcse", choices=("mirror", "simcse", "bsl", "ct"))
    p.add_argument("--negatives", default="simcse", choices=("report", "simcse", "ntxent"))
    p.add_argument("--pooling", default="cls-mlp", choices=("mean", "cls", "cls-mlp"))
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if not args.model:
        p.error("give MODEL")
    common = {k: getattr(args, k) for k in ("model", "device", "precision", "steps", "warmup", "method",
                                             "negatives", "pooling", "threads")}
    batches = [int(b) for b in args.batches.split(",")]
    configs = [(b, None) for b in batches] + [(b, args.mini_batch_size) for b in batches if b > args.mini_batch_size]
    results = []
    for batch, mini in sorted(configs, key=lambda c: (c[0], c[1] or 0)):
        result = run_child(common | {"batch": batch, "mini_batch_size": mini})
        print(f"batch {batch}, M {mini or '-'}: {result['step_ms']:.0f} ms, peak RSS {result['peak_rss_mib']:.0f} MiB",
              file=sys.stderr)
        results.append(result)
    print(table(results))
    print(goals(results, args.mini_batch_size))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": common, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
