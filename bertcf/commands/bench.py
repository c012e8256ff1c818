"""``python -m bertcf.bench`` / ``bertcf-bench``: the benchmark's command line. What it measures,
and how: :mod:`bertcf.bench` (whose docstring's first paragraph is --help's description)."""
from __future__ import annotations

import argparse
import platform
import time

import torch

from .. import bench
from ..bench.load import DEFAULT_CHECK_S, LIMIT_CORES, LoadMonitor
from ..bench.models import Encoder, load_models
from ..bench.onnx_encode import print_onnx, run_onnx
from ..bench.timing import device_name, time_workload
from ..bench.workloads import DEFAULT_WORKLOADS, MULTITASK_VARIANTS, PEFT_VARIANTS, WORKLOAD_CLASSES, WORKLOADS


def named_graph(text: str) -> tuple[str, str]:
    """--onnx-graph's NAME=FILE, the file an existing one."""
    from pathlib import Path

    name, _, path = text.partition("=")
    if not name or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"give NAME=FILE with an existing .onnx file, not {text}")
    return name, path


def build_parser() -> argparse.ArgumentParser:
    from ..cli import AT_LEAST_0, AT_LEAST_1, NON_NEGATIVE, ArgumentParser

    p = ArgumentParser(prog="python -m bertcf.bench", description=bench.__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert-base-uncased",
                   help="checkpoint directory, directory or file with a config.json, or hub name")
    p.add_argument("--tiny", action="store_true", help="a 2-layer hidden-32 random model (for tests)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default=None,
                   help="autocast precision (default: bf16 on a GPU that supports it, else fp32)")
    p.add_argument("--steps", type=AT_LEAST_1, default=20,
                   help="timed steps per model and workload")
    p.add_argument("--warmup", type=AT_LEAST_0, default=3, help="untimed steps first")
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                   help=f"the workloads to time, comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--encode-sentences", type=AT_LEAST_1, default=256,
                   help="sentences per encode step")
    p.add_argument("--minbert-only", action="store_true",
                   help="time minBERT alone (no transformers rows): to compare workloads with each other, such as "
                        "stage 3's variants against its multitask step")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile both models (minBERT layer by layer, transformers whole; dynamic shapes)")
    p.add_argument("--no-unpad", action="store_true",
                   help="minBERT computes the padding too, as transformers does (shows what unpadding gains)")
    p.add_argument("--profile", type=AT_LEAST_0, default=0, metavar="N",
                   help="after timing, profile N of minBERT's steps of each workload (torch.profiler) and print "
                        "the operator table (0: off)")
    p.add_argument("--threads", type=AT_LEAST_1, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--seed", type=int, default=11711,
                   help="seed of the random inputs, and of the weights where they are random")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--onnx", default=None, metavar="EXPORT_DIR",
                   help="instead of the workloads: time encode() on STS-B test, on the CPU, by the checkpoint of this "
                        "directory written by bertcf-export onnx in torch (minBERT, transformers) and by ONNX Runtime "
                        "on fp32 and int8 graphs of it (python -m bertcf.bench --help's epilogue: docs/benchmark.md)")
    p.add_argument("--senteval-dir", default="data/SentEval", help="--onnx: SentEval's data, for STS-B test")
    p.add_argument("--onnx-graph", action="append", type=named_graph, default=None, metavar="NAME=FILE",
                   help="--onnx: also time this graph file (the export's inputs and outputs: an earlier export's "
                        "encoder.onnx, say) under NAME, and profile it; repeatable")
    p.add_argument("--allow-busy", action="store_true",
                   help=f"run and report even when other processes take more than {LIMIT_CORES} of a core, before "
                        f"or during the run (a one-line warning; the JSON's info.load says busy); without it the "
                        f"bench refuses")
    p.add_argument("--load-check", type=NON_NEGATIVE, default=DEFAULT_CHECK_S, metavar="SECONDS",
                   help="the idle check before the run: how long to measure what other processes take (0: none; "
                        "the run itself is measured all the same)")
    add_search_flags(p)
    return p


def add_search_flags(p: argparse.ArgumentParser) -> None:
    """``--search``'s flags (``bench/search.py``), and the index settings of ``bertcf.config.search``."""
    from ..bench.search import DEFAULT_VARIANTS, VARIANTS
    from ..cli import AT_LEAST_1
    from ..config.search import IndexConfig

    group = p.add_argument_group("--search (the search indexes; faiss: pip install 'bertcf[search]')")
    group.add_argument("--search", default=None, metavar="VECTORS.npy|random",
                       help="instead of the workloads: build and query each search index on these vectors (a .npy of "
                            "float vectors [n, dim]) or on --search-n random unit vectors")
    group.add_argument("--search-n", type=AT_LEAST_1, default=100_000, help="random: the corpus's vectors")
    group.add_argument("--search-dim", type=AT_LEAST_1, default=384, help="random: their dimensions")
    group.add_argument("--search-queries", type=AT_LEAST_1, default=1000,
                       help="queries: random unit vectors, or the last rows of the .npy, held out of the corpus")
    group.add_argument("--search-k", type=AT_LEAST_1, default=10, help="neighbours per query (recall@k)")
    group.add_argument("--search-rounds", type=AT_LEAST_1, default=3, help="timed rounds of every query")
    group.add_argument("--search-indexes", default=",".join(DEFAULT_VARIANTS),
                       help=f"the indexes, comma-separated, from {', '.join(VARIANTS)}")
    IndexConfig.add_arguments(p, only=("hnsw_m", "ef_construction", "ef_search", "rescore_multiplier"))


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def run(argv=None, monitor: LoadMonitor | None = None) -> dict:
    """The benchmark: the workloads against transformers, or with ``--onnx`` the ONNX encode
    comparison, or with ``--search`` the search indexes; prints the results and returns them
    (``{"info": ..., "results": ...}``). Every mode runs inside the one ``monitor`` (default: the
    machine's own counters, ``bench.load``): an idle check before anything is loaded, the load over
    the run, both judged before the mode's table and JSON are written, and kept in ``info.load``."""
    from ..errors import UsageError

    args = build_parser().parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        raise UsageError(f"--workloads: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(WORKLOADS)}")
    if args.compile and set(workloads) & set(PEFT_VARIANTS):
        raise UsageError(f"--compile: the peft variants ({', '.join(w for w in workloads if w in PEFT_VARIANTS)}) "
                         f"wrap a copy of the encoder, which is not compiled; time them without --compile")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.search:
        from ..bench.search import print_search, run_search
        from ..config.search import IndexConfig
        measure, report = (lambda: run_search(args, IndexConfig(**IndexConfig.pick(args)))), print_search
    elif args.onnx:
        measure, report = (lambda: run_onnx(args)), print_onnx
    else:
        measure, report = (lambda: run_workloads(args, workloads)), print_workloads_report
    monitor = monitor or LoadMonitor()
    monitor.begin(args.load_check, args.allow_busy)
    out = measure()
    monitor.end()  # refuses (BusyMachine) before any table or JSON, unless --allow-busy
    out["info"]["load"] = monitor.record()
    report(out)
    if args.json:
        from ..utils.files import write_json_atomic
        write_json_atomic(args.json, out)
        print(f"results written to {args.json}")
    return out


def run_workloads(args, workloads: list[str]) -> dict:
    """minBERT against transformers on each of ``workloads``, steps alternating; a line per
    workload as it finishes (progress), the table from :func:`run` (``print_workloads_report``)."""
    import transformers

    from ..utils.precision import resolve_device, resolve_precision

    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    wall = time.perf_counter()
    mb, hf, note = load_models(args.model, args.tiny, args.seed)
    encoders = {"minbert": Encoder(mb.to(device), args.compile, unpad=not args.no_unpad)}
    if not args.minbert_only:
        encoders["transformers"] = Encoder(hf.to(device), args.compile)
    config = mb.config
    info = {"model": "tiny" if args.tiny else args.model, "weights": note, "device": device_name(device),
            "precision": precision, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "steps": args.steps, "warmup": args.warmup,
            "compile": args.compile, "unpad": not args.no_unpad, "config": {k: getattr(config, k) for k in
                                                ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                 "intermediate_size", "vocab_size")},
            "encoder_params": sum(p.numel() for p in mb.parameters())}
    print(f"bench: {info['model']} ({note}); hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
          f"{info['encoder_params'] / 1e6:.1f}M parameters")
    print(f"device: {info['device']}; precision {precision}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, python {info['python']}")
    print(f"timing: median of {args.steps} steps after {args.warmup} warm-up steps, "
          + ("minBERT alone" if args.minbert_only else "minBERT and transformers alternating"), flush=True)
    results = {}
    n_batches = max(1, min(args.steps + args.warmup, 8))
    for i, name in enumerate(workloads):
        skip = WORKLOAD_CLASSES[name].unavailable(name)
        if skip:
            results[name] = {"skipped": skip}
            print(f"{name} skipped: {skip}", flush=True)
            continue
        kwargs = {"sentences": args.encode_sentences} if name == "encode" else {}
        # A workload's inputs come from its own seed; stage 3's variants share the multitask step's, so
        # each is timed on the very batches its baseline is.
        seed = args.seed + WORKLOADS.index("multitask" if name in MULTITASK_VARIANTS else name)
        workload = WORKLOAD_CLASSES[name](name, config, device, precision, n_batches, seed, **kwargs)
        start = time.perf_counter()
        results[name] = r = time_workload(workload, encoders, args.steps, args.warmup, args.profile)
        r["wall_s"] = time.perf_counter() - start
        print_workload(name, r, args.profile)
    info["wall_s"] = time.perf_counter() - wall
    return {"info": info, "results": results}


def print_workloads_report(out: dict) -> None:
    """The workloads' table and wall time, once the run's load was judged (:func:`run`)."""
    print_table(out["results"])
    print(f"\nwall time {out['info']['wall_s']:.1f} s")


def print_workload(name: str, r: dict, profile: int) -> None:
    """One workload's lines as it finishes: the profile's table (with --profile), each
    implementation's step time and throughput, the speed-up."""
    if profile:
        kernels = r["profile"]["gpu_kernels_per_step"]
        print(f"{name} minBERT, torch.profiler over {profile} steps"
              + (f" ({kernels:.0f} GPU kernels a step)" if kernels else "") + ":\n" + r["profile"]["table"])
    for impl in [i for i in ("minbert", "transformers") if i in r]:
        x = r[impl]
        print(f"{name:9s} {impl:12s} {x['ms_per_step']:10.2f} ms/step {x['tokens_per_s']:12,.0f} tokens/s "
              f"{x['sentences_per_s']:10,.1f} sentences/s" + (f"  MFU {100 * x['mfu']:.1f}%" if x["mfu"] else ""),
              flush=True)
        if x.get("peak_bytes") is not None:
            print(f"{name:9s} {impl:12s} {memory_line(x)}", flush=True)
    if "speedup" in r:
        print(f"{name:9s} speed-up minBERT/transformers: {r['speedup']:.3f}x "
              f"({'minBERT faster' if r['speedup'] >= 1 else 'minBERT slower'})", flush=True)


def mib(x) -> str:
    return fmt(x and x / 2 ** 20, ",.1f")


def memory_line(x: dict) -> str:
    """An implementation's memory on a workload (``bench.timing.step_memory``)."""
    trains = "" if x["trainable_params"] is None else (f"trains {x['trainable_params']:,} parameters, AdamW's state "
                                                       f"{mib(x['optimizer_state_bytes'])} MiB; ")
    device = "" if x["device_peak_bytes"] is None else f"; device maximum {mib(x['device_peak_bytes'])} MiB"
    return (f"{trains}weights {mib(x['weights_bytes'])} MiB, the step's peak {mib(x['step_peak_bytes'])} MiB "
            f"above its start, {mib(x['peak_bytes'])} MiB in all{device}")


def print_memory_table(results: dict) -> None:
    """A row per workload: what it trains, AdamW's state, each implementation's step peak and peak in all."""
    impls = [i for i in ("minbert", "transformers") if any(i in r for r in results.values())]
    head = "| workload | trainable parameters | AdamW state MiB |" + "".join(
        f" {'minBERT' if i == 'minbert' else i} step peak MiB | {'minBERT' if i == 'minbert' else i} peak MiB |"
        for i in impls)
    print("\n" + head + "\n|" + "---|" * (head.count("|") - 1))
    for name, r in results.items():
        x = r["minbert"]
        trainable = fmt(x["trainable_params"], ",")
        row = f"| {name} | {trainable} | {mib(x['optimizer_state_bytes'])} |"
        print(row + "".join(f" {mib(r[i]['step_peak_bytes'])} | {mib(r[i]['peak_bytes'])} |" for i in impls))


def print_table(results: dict) -> None:
    """The tidy table: a row per workload (MFU columns where a workload has one), then the memory
    table; a workload skipped is a line below them."""
    skipped = {name: r["skipped"] for name, r in results.items() if "skipped" in r}
    results = {name: r for name, r in results.items() if name not in skipped}
    if results:
        print_timing_table(results)
        print_memory_table(results)
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")


def print_timing_table(results: dict) -> None:
    print()
    head = "| workload | per step | minBERT ms | transformers ms | minBERT tokens/s | transformers tokens/s | speed-up |"
    mfu_cols = any(results[w]["minbert"]["mfu"] for w in results)
    if mfu_cols:
        head += " minBERT MFU | transformers MFU |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, r in results.items():
        ps = r["per_step"]
        hf = r.get("transformers", {})  # absent with --minbert-only
        row = (f"| {name} | {ps['sentences']:.0f} sent, {ps['tokens']:.0f} tok, padded {ps['padded_tokens']:.0f} | "
               f"{r['minbert']['ms_per_step']:.2f} | "
               f"{fmt(hf.get('ms_per_step'), '.2f')} | {r['minbert']['tokens_per_s']:,.0f} | "
               f"{fmt(hf.get('tokens_per_s'), ',.0f')} | {fmt(r.get('speedup'), '.3f')}{'x' if 'speedup' in r else ''} |")
        if mfu_cols:
            row += (f" {fmt(r['minbert']['mfu'] and 100 * r['minbert']['mfu'], '.1f')}% |"
                    f" {fmt(hf.get('mfu') and 100 * hf['mfu'], '.1f')}% |")
        print(row)


def main(argv=None) -> int:
    """``bertcf-bench``: :func:`run`; bad input is one line on stderr and exit status 2."""
    from ..cli import run_main

    return run_main(run, argv)
