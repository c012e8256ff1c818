"""``python -m bertcf.bench``: end to end on --tiny (CPU, 1 thread, 2 steps), its JSON, the model
loading it relies on (same weights in both implementations), and the FLOPs against torch's counter."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_side_by_side

from bertcf.bench import batches, models, timing
from bertcf.bench.workloads import DEFAULT_WORKLOADS as WORKLOADS

REPO = Path(__file__).resolve().parents[2]


def run_bench(*args):
    return subprocess.run([sys.executable, "-m", "bertcf.bench", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory) -> dict:
    """The three --tiny runs whose output the slow tests below read, started side by side once for the module
    (each is a Python start and a few one-thread steps; one after the other they left a core idle):
    name -> (its CompletedProcess, its --json file). Each run's load check sees the others: --allow-busy."""
    from bertcf.bench.workloads import MULTITASK_VARIANTS, PEFT_VARIANTS

    out = tmp_path_factory.mktemp("bench-runs")
    # upgrad needs the solver extra; the adapter variants: tests/bench/test_peft_bench.py
    variants = [v for v in MULTITASK_VARIANTS if v not in ("multitask-upgrad", "multitask-upgrad-gramian", *PEFT_VARIANTS)]
    argvs = {"tiny": ["--steps", "2", "--warmup", "1", "--threads", "1", "--allow-busy"],
             "profile": ["--steps", "1", "--warmup", "0", "--threads", "1", "--workloads", "mirror", "--profile", "2",
                         "--allow-busy", "--load-check", "0"],
             "multitask": ["--steps", "1", "--warmup", "0", "--threads", "1", "--allow-busy", "--load-check", "0",
                           "--minbert-only", "--workloads", ",".join(["multitask", *variants])]}
    done = run_side_by_side({name: [sys.executable, "-m", "bertcf.bench", "--tiny", "--device", "cpu", *argv, "--json",
                                    str(out / f"{name}.json")] for name, argv in argvs.items()}, cwd=REPO)
    return {name: (proc, out / f"{name}.json") for name, proc in done.items()} | {"variants": variants}


@pytest.mark.slow
def test_bench_tiny_end_to_end(bench_runs):
    proc, out = bench_runs["tiny"]  # --steps 2 --warmup 1, the machine's load checked before
    assert proc.returncode == 0, proc.stderr
    assert "load: " in proc.stdout  # the idle check's line, and the run's
    for name in WORKLOADS:
        assert f"{name:9s} speed-up minBERT/transformers:" in proc.stdout
        assert f"{name:9s} minbert" in proc.stdout and f"{name:9s} transformers" in proc.stdout
    assert "torch " + torch.__version__ in proc.stdout and "transformers " in proc.stdout
    assert "| workload |" in proc.stdout  # the table
    data = json.loads(out.read_text())
    assert data["info"]["device"] and data["info"]["torch"] == torch.__version__
    load = data["info"]["load"]
    assert load["measured"] and load["allow_busy"] and load["before"]["seconds"] > 0 and load["during"]["seconds"] > 0
    assert set(data["results"]) == set(WORKLOADS)
    for name, r in data["results"].items():
        for impl in ("minbert", "transformers"):
            assert r[impl]["ms_per_step"] > 0 and r[impl]["tokens_per_s"] > 0
            assert len(r[impl]["times_ms"]) == 2
            assert r[impl]["mfu"] is None  # no peak on a CPU
        assert r["speedup"] == pytest.approx(r["transformers"]["ms_per_step"] / r["minbert"]["ms_per_step"])
    assert data["results"]["multitask"]["per_step"]["sentences"] == 32 + 96 * 2 + 32 * 2
    for name, r in data["results"].items():
        assert r["per_step"]["padded_tokens"] > r["per_step"]["tokens"], name  # random lengths: padding
    assert data["results"]["mirror"]["per_step"]["sentences"] == 32


@pytest.mark.slow
def test_bench_profile_prints_the_operator_table(bench_runs):
    proc, out = bench_runs["profile"]  # --workloads mirror --profile 2
    assert proc.returncode == 0, proc.stderr
    assert "mirror minBERT, torch.profiler over 2 steps" in proc.stdout
    profile = json.loads(out.read_text())["results"]["mirror"]["profile"]
    assert profile["steps"] == 2 and "aten::" in profile["table"] and profile["table"] in proc.stdout
    assert profile["gpu_kernels_per_step"] is None  # the CPU


@pytest.mark.slow
def test_bench_rejects_unknown_workload():
    proc = run_bench("--tiny", "--device", "cpu", "--workloads", "mirror,nope")
    assert proc.returncode == 2
    assert "nope" in proc.stderr and "Traceback" not in proc.stderr


def test_config_only_dir_gives_identical_models(tmp_path):
    """A directory with only config.json: random weights, the same in minBERT and transformers."""
    config = dict(models.TINY_CONFIG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, model_type="bert")
    (tmp_path / "config.json").write_text(json.dumps(config))
    mb, hf, note = models.load_models(str(tmp_path))
    assert "random" in note and hf.config._attn_implementation == "sdpa"
    g = torch.Generator().manual_seed(0)
    batch = batches.make_batch([7, 12, 5], mb.config.vocab_size, g, "cpu",
                               batches.special_ids(mb.config.vocab_size)[:2])
    mb.eval(), hf.eval()
    with torch.no_grad():
        a = batch.hidden(models.Encoder(mb))
        b = batch.hidden(models.Encoder(hf))
    real = batch.mask.bool()
    torch.testing.assert_close(a[real], b[real], rtol=1e-4, atol=1e-5)
    assert batch.tokens == 24 and batch.ids.shape == (3, 12)
    assert (batch.ids[batch.mask == 0] == 0).all()


@pytest.mark.parametrize("length", [10, 17])
def test_flops_match_torch_flop_counter_on_transformers(length):
    """encoder_flops against an independent count: torch's FlopCounterMode over transformers'
    BertModel with eager attention (explicit matmuls), forward (inference) and forward + backward
    (training), one sentence of ``length`` real tokens, no pooler."""
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    config = models.load_models(None, tiny=True)[0].config
    hf_config = transformers.BertConfig.from_dict(config.to_dict())
    hf_config._attn_implementation = "eager"
    model = transformers.BertModel(hf_config, add_pooling_layer=False)
    ids = torch.randint(5, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as inference:
        model.eval()(input_ids=ids)
    with FlopCounterMode(display=False) as training:
        model.train()(input_ids=ids).last_hidden_state.sum().backward()
    assert timing.encoder_flops(config, [length], training=False) == inference.get_total_flops()
    assert timing.encoder_flops(config, [length], training=True) == training.get_total_flops()
    assert timing.encoder_flops(config, [length, length], training=True) == 2 * training.get_total_flops()


def test_peak_flops():
    assert timing.peak_flops(torch.device("cpu"), "bf16") is None
    names = dict(timing.PEAK_TFLOPS_16BIT)
    assert names["H100"] == names["H200"] == 989.0 and names["A100"] == 312.0


def test_padding_counts_length_sorted_batches():
    from bertcf.bench.onnx_encode import padding

    assert padding([3, 5, 2, 7, 7, 1], batch_size=4) == 4 * 7 + 2 * 2  # [7, 7, 5, 3] and [2, 1]
    assert padding([9] * 130) == 9 * 130


def test_onnx_torch_rows_each_run_their_own_model(tiny_bert_dir, tmp_path, monkeypatch):
    """Issue 60: --onnx's "transformers torch fp32" row equalled minBERT's torch row to the sentence
    per second in two runs. Each row runs its own model: while the transformers engine encodes,
    transformers' BertModel.forward runs and minBERT's never does, and the reverse (spies on both
    classes); their vectors agree. What the two rows have in common is the input: STS-B test in
    length-sorted batches of 64 is hardly padded, so minBERT's unpadding saves little there, which
    the run records (info's tokens and padded_tokens). The ONNX graphs are left out (their export
    takes seconds; tests/backend/test_onnx.py runs them)."""
    import minbert
    import transformers

    from bertcf.backend.onnx_runtime import CONFIG_FILE, FORMAT
    from bertcf.bench import onnx_encode, onnx_variants
    from bertcf.bench.load import LoadMonitor
    from bertcf.commands import bench

    export = tmp_path / "export"
    export.mkdir()
    (export / CONFIG_FILE).write_text(json.dumps({"format": FORMAT, "source": str(tiny_bert_dir)}))
    monkeypatch.setattr(onnx_variants, "build", lambda *args: {})
    sts = tmp_path / "senteval" / "STS" / "STSBenchmark"
    sts.mkdir(parents=True)
    texts = ["A man is playing a guitar.", "Two dogs run across the park in the morning sun.", "Hello",
             "A woman slices an onion on a wooden board in the kitchen.", "ok ok"]
    rows = [("main-captions", "MSRvid", "2012test", f"{i:04d}", f"{i % 6}.000", a, b)
            for i, (a, b) in enumerate(zip(texts, texts[1:] + texts[:1]))]
    for split in ("train", "test"):  # train: the static graphs' calibration (none built here)
        (sts / f"sts-{split}.csv").write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")

    calls, encoding = [], [None]
    for cls, model in ((minbert.BertModel, "minBERT"), (transformers.BertModel, "transformers")):
        def spy(self, *args, _forward=cls.forward, _model=model, **kwargs):
            calls.append((encoding[0], _model))
            return _forward(self, *args, **kwargs)
        monkeypatch.setattr(cls, "forward", spy)
    time_onnx_encode = onnx_encode.time_onnx_encode

    def timed(engines, *args, **kwargs):
        for name, engine in engines.items():
            def encode(*a, _name=name, _encode=engine.encode, **k):
                encoding[0] = _name
                try:
                    return _encode(*a, **k)
                finally:
                    encoding[0] = None
            engine.encode = encode
        return time_onnx_encode(engines, *args, **kwargs)
    monkeypatch.setattr(onnx_encode, "time_onnx_encode", timed)

    result = bench.run(["--onnx", str(export), "--senteval-dir", str(tmp_path / "senteval"), "--steps", "2",
                        "--warmup", "0", "--load-check", "0"], monitor=LoadMonitor(reader=lambda: None))
    rows = result["results"]["onnx_encode"]
    assert list(rows) == ["torch fp32 (minBERT)", "transformers torch fp32"]
    ran = {engine: {model for e, model in calls if e == engine} for engine in rows}
    assert ran == {"torch fp32 (minBERT)": {"minBERT"}, "transformers torch fp32": {"transformers"}}
    assert rows["transformers torch fp32"]["max_abs_diff_vs_torch"] < 1e-5
    info = result["info"]
    assert info["tokens"] < info["padded_tokens"] and info["load"]["measured"] is False


@pytest.mark.slow
def test_the_multitask_variants_run_the_stage_3_step(bench_runs):
    """Each stage-3 variant (a sampling mode, the conflict logging, a method) times the real step
    (bertcf.multitask's sampler and methods), here minBERT's alone."""
    (proc, out), variants = bench_runs["multitask"], bench_runs["variants"]  # --minbert-only
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"multitask", *variants}
    assert all("transformers" not in r and "speedup" not in r for r in results.values())  # --minbert-only
    assert "minBERT alone" in proc.stdout and "| multitask-pcgrad |" in proc.stdout
    # one task a step: fewer sentences than the step of all three
    per_step = {name: r["per_step"]["sentences"] for name, r in results.items()}
    assert per_step["multitask-round-robin"] < per_step["multitask"] == per_step["multitask-pcgrad"]
