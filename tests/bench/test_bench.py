"""``python -m bertcf.bench``: end to end on --tiny (CPU, 1 thread, 2 steps), its JSON, the model
loading it relies on (same weights in both implementations), and the FLOPs against torch's counter."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertcf.bench import batches, models, timing
from bertcf.bench.workloads import WORKLOADS

REPO = Path(__file__).resolve().parents[2]


def run_bench(*args):
    return subprocess.run([sys.executable, "-m", "bertcf.bench", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_bench_tiny_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_bench("--tiny", "--device", "cpu", "--steps", "2", "--warmup", "1", "--threads", "1",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in WORKLOADS:
        assert f"{name:9s} speed-up minBERT/transformers:" in proc.stdout
        assert f"{name:9s} minbert" in proc.stdout and f"{name:9s} transformers" in proc.stdout
    assert "torch " + torch.__version__ in proc.stdout and "transformers " in proc.stdout
    assert "| workload |" in proc.stdout  # the table
    data = json.loads(out.read_text())
    assert data["info"]["device"] and data["info"]["torch"] == torch.__version__
    assert set(data["results"]) == set(WORKLOADS)
    for name, r in data["results"].items():
        for impl in ("minbert", "transformers"):
            assert r[impl]["ms_per_step"] > 0 and r[impl]["tokens_per_s"] > 0
            assert len(r[impl]["times_ms"]) == 2
            assert r[impl]["mfu"] is None  # no peak on a CPU
        assert r["speedup"] == pytest.approx(r["transformers"]["ms_per_step"] / r["minbert"]["ms_per_step"])
    assert data["results"]["multitask"]["per_step"]["sentences"] == 32 + 96 * 2 + 32 * 2
    assert data["results"]["mirror"]["per_step"]["sentences"] == 32


@pytest.mark.slow
def test_bench_profile_prints_the_operator_table(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_bench("--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--threads", "1",
                     "--workloads", "mirror", "--profile", "2", "--json", str(out))
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
