"""``--onnx EXPORT_DIR``: ``encode()`` of STS-B test's sentences by the exported checkpoint under
torch fp32, by transformers' BertModel of the same weights, and by every graph variant under ONNX
Runtime fp32 and int8 (``onnx_variants``), on the CPU, in one run."""
from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path

import torch

from .timing import device_name

def stsb_test_sentences(senteval_dir) -> tuple[list[str], list]:
    """STS-B test's sentences, both of every pair in file order (duplicates kept: 2 x 1,379), and its pairs."""
    from ..data.senteval import read_stsb
    from ..errors import DataError

    path = Path(senteval_dir) / "STS" / "STSBenchmark" / "sts-test.csv"
    if not path.is_file():
        raise DataError(f"--onnx times STS-B test's sentences: {path} not found (give --senteval-dir)")
    pairs = read_stsb(path)
    return [s for p in pairs for s in (p.sentence1, p.sentence2)], pairs


def stsb_train_sentences(senteval_dir, n: int) -> list[str]:
    """The first ``n`` distinct sentences of STS-B train: the static int8 graphs' calibration, apart
    from the test sentences timed and scored."""
    from ..data.senteval import read_stsb
    from ..errors import DataError

    path = Path(senteval_dir) / "STS" / "STSBenchmark" / "sts-train.csv"
    if not path.is_file():
        raise DataError(f"--onnx calibrates its static int8 graphs on STS-B train: {path} not found")
    return list(dict.fromkeys(s for p in read_stsb(path) for s in (p.sentence1, p.sentence2)))[:n]


#: The graphs whose time --onnx breaks down by operator (ONNX Runtime's profiler, one extra encode each),
#: besides every --onnx-graph.
PROFILED = ("minBERT fp32", "minBERT int8", "minBERT int8 SkipLayerNorm", "minBERT int8 blockwise",
            "minBERT int8 dynamic", "transformers export + ORT optimizer fp32", "transformers export + ORT optimizer int8")


def operator_profile(scratch: Path, graph: Path, threads: int | None, sentences: list[str]) -> dict:
    """Where one ``encode(sentences)`` of ``graph`` spends its kernel time, by operator type:
    {op type: {"ms", "share"}}, largest first (ONNX Runtime's profiler; its own overhead included)."""
    import json
    from collections import Counter

    import onnxruntime as ort

    from ..backend.onnx_runtime import OnnxEncoder

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(scratch / f"profile-{graph.stem}")
    engine = OnnxEncoder(scratch, threads=threads, providers=["CPUExecutionProvider"], graph=graph.name,
                         session_options=options)
    engine.encode(sentences, batch_size=64)
    events = json.loads(Path(engine.session.end_profiling()).read_text())
    micros = Counter()
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            micros[event["args"]["op_name"]] += event["dur"]
    total = sum(micros.values()) or 1
    return {op: {"ms": us / 1000, "share": us / total} for op, us in micros.most_common()}


def padding(lengths: list[int], batch_size: int = 64) -> int:
    """The tokens of length-sorted batches of ``batch_size``, each padded to its longest (as every
    engine's ``encode`` batches): what a padded engine computes, where unpadded minBERT computes
    ``sum(lengths)``."""
    ordered = sorted(lengths, reverse=True)
    return sum(ordered[i] * len(ordered[i:i + batch_size]) for i in range(0, len(ordered), batch_size))


def onnx_engines(export_dir, threads: int | None, scratch: Path, calibration: list[str],
                 extra: dict | None = None) -> tuple[dict, dict, dict]:
    """(name -> engine, name -> the operators ONNX Runtime runs for its graph, name -> its graph
    file): minBERT in torch fp32 (the exported checkpoint, on the CPU; the baseline), transformers'
    BertModel in torch, and ONNX Runtime (CPU execution provider) on every graph variant, written
    into ``scratch`` (``calibration``: the static int8 graphs' sentences; ``extra``: name -> another
    graph file to time)."""
    from minbert import CheckpointError

    from ..backend.onnx_runtime import OnnxEncoder, OnnxModelError, read_config
    from ..backend.transformers_graph import TransformersEncoder
    from ..models.encoder import SentenceEncoder
    from . import onnx_variants

    try:
        source = read_config(Path(export_dir))["source"]
    except OnnxModelError as e:
        raise CheckpointError(str(e)) from None
    torch_encoder = SentenceEncoder.from_pretrained(source).eval()
    torch_encoder.precision = "fp32"
    engines, operators = {"torch fp32 (minBERT)": torch_encoder}, {}
    try:
        engines["transformers torch fp32"] = TransformersEncoder(torch_encoder)
    except ValueError:  # a flow or first-last-avg: no transformers counterpart
        pass
    graphs = onnx_variants.build(Path(export_dir), torch_encoder, scratch, calibration, extra)
    for name, graph in graphs.items():
        engines[name] = OnnxEncoder(scratch, threads=threads, providers=["CPUExecutionProvider"], graph=graph.name)
        operators[name] = onnx_variants.operator_counts(graph)
    return engines, operators, graphs


def time_onnx_encode(engines: dict, sentences: list[str], pairs: list, steps: int, warmup: int,
                     batch_size: int = 64) -> dict:
    """Each engine's ``encode(sentences, batch_size)`` (tokenisation, length-sorted batches, rows
    in input order), engines alternating, order flipped every round; the median round. With each
    engine's STS-B test Spearman x 100 and its max abs difference from torch fp32."""
    import numpy as np

    from ..evaluation.metrics import spearman

    names, times, vectors = list(engines), {name: [] for name in engines}, {}
    for i in range(warmup + steps):
        for name in (names if i % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            out = engines[name].encode(sentences, batch_size=batch_size)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
            vectors[name] = np.asarray(out, dtype=np.float64)
    results = {}
    for name in names:
        v = vectors[name]
        u, w = v[0::2], v[1::2]
        cosines = (u * w).sum(1) / np.maximum(np.linalg.norm(u, axis=1) * np.linalg.norm(w, axis=1), 1e-12)
        median = statistics.median(times[name])
        results[name] = {"seconds": median, "sentences_per_s": len(sentences) / median,
                         "vs_torch_fp32": statistics.median(times[names[0]]) / median,
                         "stsb_test_spearman": 100 * spearman(torch.from_numpy(cosines), [p.label for p in pairs]),
                         "max_abs_diff_vs_torch": float(np.abs(v - vectors[names[0]]).max()),
                         "times_s": times[name]}
    return results


def run_onnx(args) -> dict:
    """``--onnx DIR``: the encode comparison of every engine (``onnx_engines``), in one run; its
    table (``print_onnx``) and JSON come from the command, once the run's load was judged."""
    import tempfile

    import onnxruntime

    from .onnx_variants import CALIBRATION_SENTENCES

    sentences, pairs = stsb_test_sentences(args.senteval_dir)
    calibration = stsb_train_sentences(args.senteval_dir, CALIBRATION_SENTENCES)
    with tempfile.TemporaryDirectory(prefix="bertcf-bench-onnx-") as scratch:
        extra = dict(args.onnx_graph or [])
        engines, operators, graphs = onnx_engines(args.onnx, args.threads, Path(scratch), calibration, extra)
        info = {"export": str(args.onnx), "device": device_name(torch.device("cpu")), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "python": platform.python_version(),
                "threads": args.threads, "sentences": len(sentences), "batch_size": 64, "steps": args.steps,
                "warmup": args.warmup}
        # The tokens with and without padding: transformers' torch engine computes the padding, minBERT's skips
        # it, so their ratio bounds what unpadding can gain here (little: the sentences are many and sorted).
        lengths = [len(ids) for ids in engines["torch fp32 (minBERT)"].token_ids(sentences)]
        info["tokens"], info["padded_tokens"] = sum(lengths), padding(lengths, info["batch_size"])
        print(f"bench --onnx: the export {info['export']}; STS-B test, {len(sentences)} sentences ({info['tokens']:,} "
              f"tokens, {info['padded_tokens']:,} padded), length-sorted batches of 64; median of {args.steps} rounds "
              f"after {args.warmup}, engines alternating")
        print(f"device: {info['device']} ({info['cpu_capability']}); torch {torch.__version__}, onnxruntime "
              f"{onnxruntime.__version__}", flush=True)
        results = time_onnx_encode(engines, sentences, pairs, args.steps, args.warmup)
        for name in (*PROFILED, *extra):
            if name in graphs:
                results[name]["profile"] = operator_profile(Path(scratch), graphs[name], args.threads, sentences)
    for name, ops in operators.items():
        results[name]["operators"] = ops
    return {"info": info, "results": {"onnx_encode": results}}


def print_onnx(out: dict) -> None:
    """``--onnx``'s table, once the run's load was judged (``bertcf.commands.bench.run``)."""
    print("\n| engine | sentences/s | x torch fp32 | STS-B test Spearman x100 | max abs diff vs torch | "
          "operators as ONNX Runtime runs the graph |")
    print("|---|---|---|---|---|---|")
    for name, r in out["results"]["onnx_encode"].items():
        ops = ", ".join(f"{k} {v}" for k, v in r.get("operators", {}).items())
        print(f"| {name} | {r['sentences_per_s']:,.0f} | {r['vs_torch_fp32']:.2f}x | {r['stsb_test_spearman']:.2f} | "
              f"{r['max_abs_diff_vs_torch']:.1e} | {ops} |")
    profiled = {name: r["profile"] for name, r in out["results"]["onnx_encode"].items() if "profile" in r}
    if profiled:
        print("\nWhere the time goes (ONNX Runtime's profiler, one encode of the same sentences): each operator "
              "type's kernel time and share, those of 2% or more")
        for name, profile in profiled.items():
            total = sum(p["ms"] for p in profile.values())
            shares = ", ".join(f"{op} {p['ms']:,.0f} ms ({100 * p['share']:.0f}%)" for op, p in profile.items()
                               if p["share"] >= 0.02)
            print(f"- {name} ({total:,.0f} ms): {shares}")
