"""Stage 3 with --peft lora|dora|ia3 (bertcf/models/peft.py): a resumed run equals an uninterrupted one bit
for bit; the checkpoints hold the base unchanged beside the adapter as peft saves it; --merge writes a
plain checkpoint equal to the unmerged model; the parameter count and the optimiser state in the log
and TensorBoard; bad settings refused in one line with exit status 2, and a --resume that changes a
peft setting refused. --peft houlsby (bertcf/models/bottleneck.py) likewise: resumed bit for bit, the
base unchanged beside its adapters and trained LayerNorms, read back unmerged, --merge refused."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import multitask_argv, quiet_multitask, refused, write_cs224n_files
from safetensors.torch import load_file

peft = pytest.importorskip("peft", reason="peft is an optional extra: pip install -e '.[peft]'")

from bertcf.errors import UsageError  # noqa: E402
from bertcf.models import peft as adapters  # noqa: E402
from bertcf.models.bottleneck import HOULSBY_WEIGHTS, HoulsbyAdapters  # noqa: E402
from bertcf.models.encoder import SentenceEncoder  # noqa: E402
from bertcf.multitask import MultitaskModel, command  # noqa: E402
from bertcf.multitask.config import resumed  # noqa: E402
from bertcf.multitask.checks import check_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_cs224n_files(tmp_path_factory.mktemp("mt-peft"))


def run(bert_dir, data_dir, out, steps, *extra):
    return quiet_multitask(multitask_argv(bert_dir, data_dir, out, steps, "--conflict-every", "0", *extra))


def last_tensors(out: Path) -> dict:
    return {f"{name}/{k}": v for name in ("model.safetensors", "heads.safetensors", adapters.ADAPTER_WEIGHTS)
            for k, v in load_file(str(out / "last" / name)).items()}


@pytest.mark.parametrize("method", ["lora", "dora", "ia3"])
def test_resume_is_bit_identical_and_the_base_stays(tiny_bert_dir, data_dir, tmp_path, method):
    straight, part = tmp_path / "straight", tmp_path / "part"
    run(tiny_bert_dir, data_dir, straight, 4, "--peft", method)
    run(tiny_bert_dir, data_dir, part, 2, "--peft", method)
    assert quiet_multitask(["--resume", "--out-dir", str(part), "--steps", "4"])["step"] == 4
    a, b = last_tensors(straight), last_tensors(part)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    base = load_file(str(tiny_bert_dir / "model.safetensors"))
    for k, v in load_file(str(straight / "last" / "model.safetensors")).items():
        assert torch.equal(v, base[k]), k  # the encoder's own weights never train under --peft
    state = torch.load(straight / "last" / "training_state.pt", weights_only=False)
    trained = [n for n, p in state["modules"]["model"].items() if "lora_" in n or "ia3_" in n]
    assert trained and len(state["optimizer"]["state"]) == len(trained) + 2 * 3  # and each head's weight and bias
    assert (part / "predictions" / "sst-dev-output.csv").read_bytes() == \
        (straight / "predictions" / "sst-dev-output.csv").read_bytes()


def test_merge_writes_a_plain_checkpoint_equal_to_the_unmerged_model(tiny_bert_dir, data_dir, tmp_path, capsys):
    """merged/ has no adapter, loads in transformers with nothing missing, and gives the vectors
    and head outputs of best/'s base with its adapter applied by peft, unmerged."""
    import transformers

    out = tmp_path / "run"
    run(tiny_bert_dir, data_dir, out, 2, "--peft", "lora", "--peft-rank", "4", "--merge", "--lr", "1e-2")
    assert adapters.has_adapter(out / "best") and not adapters.has_adapter(out / "merged")
    merged = MultitaskModel.from_pretrained(out / "merged").eval()
    assert merged.heads_state_dict().keys() == MultitaskModel.from_pretrained(out / "best").heads_state_dict().keys()

    unmerged = SentenceEncoder.from_pretrained(out / "best").eval()  # rebuilt unmerged below, by peft
    bert = type(unmerged.bert).from_pretrained(out / "best")  # the base alone (minBERT ignores the adapter)
    unmerged.bert = peft.PeftModel.from_pretrained(bert, str(out / "best")).get_base_model().eval()
    assert any(hasattr(m, "lora_A") for m in unmerged.bert.modules())
    sentences = ["a man plays the guitar .", "the dog runs on the beach", "two women talk about the film"]
    vectors = torch.as_tensor(unmerged.encode(sentences))
    assert (vectors - torch.as_tensor(SentenceEncoder.from_pretrained(tiny_bert_dir).eval().encode(sentences))
            ).abs().max() > 1e-4  # the adapter trained
    torch.testing.assert_close(torch.as_tensor(merged.encoder.encode(sentences)), vectors, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.as_tensor(SentenceEncoder.from_pretrained(out / "merged").encode(sentences)),
                               vectors, atol=1e-5, rtol=1e-5)
    hf, info = transformers.BertModel.from_pretrained(str(out / "merged"), output_loading_info=True)
    assert not info["missing_keys"]


def tensorboard_scalars(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}).Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_the_budget_is_logged_and_in_tensorboard(tiny_bert_dir, data_dir, tmp_path, capsys):
    """The trainable parameters and AdamW's state: a line at the start and train/ scalars, for a full
    fine-tune and for LoRA, which trains the heads and a small share of the encoder; the peak memory
    in train/ and at the end of the closing line."""
    full, lora = tmp_path / "full", tmp_path / "lora"
    capsys.readouterr()
    command.run(multitask_argv(tiny_bert_dir, data_dir, full, 2, "--conflict-every", "0", "--progress", "lines"))
    printed = capsys.readouterr()
    full_line = next(l for l in printed.err.splitlines() if "parameters" in l)
    closing = re.search(r"best checkpoint: .*; peak memory ([\d,]+) MiB resident$", printed.out, re.M)
    run(tiny_bert_dir, data_dir, lora, 2, "--peft", "lora", "--peft-rank", "2", "--peft-targets", "query,value",
        "--progress", "lines")
    lora_line = next(l for l in capsys.readouterr().err.splitlines() if "parameters" in l)
    a, b = tensorboard_scalars(full), tensorboard_scalars(lora)
    model = MultitaskModel.from_pretrained(lora / "best")
    heads = sum(v.numel() for v in model.heads_state_dict().values())
    layers, width = model.encoder.bert.config.num_hidden_layers, model.encoder.dim
    adapter = layers * 2 * (2 * width * 2)  # query and value: A [2, D] and B [D, 2] per layer
    assert set(b["train/trainable_params"]) == {heads + adapter}
    assert set(a["train/trainable_params"]) == {sum(p.numel() for p in model.parameters())}
    assert set(b["train/params"]) == {sum(p.numel() for p in model.parameters()) + adapter}
    state_mb = b["train/optimizer_state_mb"][0]
    assert state_mb * 2 ** 20 == pytest.approx(8 * (heads + adapter) + 4 * (4 * layers + 2 * len(model.tasks)))
    assert f"trains {heads + adapter:,} of" in lora_line and "lora r 2" in lora_line and "4 Linear layers" in lora_line
    assert "AdamW's state" in full_line and "lora" not in full_line
    # the peak so far at each logged step never falls, and the closing line's, taken after the end's scoring, is
    # the last of them or more
    assert a["train/peak_rss_mb"] == sorted(a["train/peak_rss_mb"]) and a["train/peak_rss_mb"][0] > 0
    assert int(closing.group(1).replace(",", "")) >= round(a["train/peak_rss_mb"][-1])


@pytest.mark.parametrize("extra, needles", [
    (["--peft", "lora", "--peft-rank", "0"], ["--peft-rank", "at least 1"]),
    (["--peft", "dora", "--freeze-encoder"], ["--freeze-encoder"]),
    (["--peft", "lora", "--peft-targets", "query,nothing"], ["--peft-targets nothing", "matches no module"]),
    (["--peft", "lora", "--peft-targets", "LayerNorm"], ["LayerNorm", "not a Linear layer"]),
    (["--peft-rank", "4"], ["--peft-rank does not apply without --peft"]),
    (["--merge"], ["--merge does not apply without --peft"]),
    (["--peft", "ia3", "--peft-dropout", "0.1"], ["--peft-dropout does not apply to --peft ia3"]),
    (["--peft", "houlsby", "--merge"], ["--merge does not apply to --peft houlsby", "nonlinearity"]),
    (["--peft", "houlsby", "--peft-rank", "4"], ["--peft-rank does not apply to --peft houlsby"]),
    (["--peft", "houlsby", "--peft-targets", "query"], ["--peft-targets does not apply to --peft houlsby"]),
    (["--peft", "houlsby", "--peft-bottleneck", "0"], ["--peft-bottleneck", "at least 1"]),
    (["--peft", "lora", "--peft-bottleneck", "4"], ["--peft-bottleneck does not apply to --peft lora"]),
    (["--peft-bottleneck", "4"], ["--peft-bottleneck does not apply without --peft"]),
    (["--peft", "houlsby", "--freeze-encoder"], ["--freeze-encoder"]),
])
def test_bad_settings_are_refused_in_one_line(tiny_bert_dir, data_dir, tmp_path, capsys, extra, needles):
    out = tmp_path / "run"
    refused(multitask_argv(tiny_bert_dir, data_dir, out, 2, *extra), capsys, *needles)
    assert not (out / "config.json").exists()


def test_resume_refuses_another_adapter(tiny_bert_dir, data_dir, tmp_path, capsys):
    """The peft settings are the run's: --resume with another method, rank or targets is refused,
    as is dropping --peft (from Python); the run stays resumable."""
    out = tmp_path / "run"
    run(tiny_bert_dir, data_dir, out, 2, "--peft", "lora")
    for flags, needle in [(["--peft", "dora"], "--peft is dora here, lora in"),
                          (["--peft-rank", "4"], "--peft-rank is 4 here, 8 in"),
                          (["--peft-targets", "query"], "--peft-targets is"),
                          (["--merge"], "--merge is true here, false in")]:
        refused(["--resume", "--out-dir", out, *flags], capsys, needle)
    with pytest.raises(UsageError, match="--peft is null here, lora in"):
        check_run(resumed(out, peft=None), [])
    assert quiet_multitask(["--resume", "--out-dir", str(out), "--steps", "3"])["step"] == 3


def test_houlsby_resumes_bit_for_bit_keeps_the_base_and_reads_back_unmerged(tiny_bert_dir, data_dir, tmp_path,
                                                                           capsys):
    """--peft houlsby: last/ of a run resumed at step 2 equals the uninterrupted run's bit for bit (the
    base, the heads, the adapters and LayerNorms); the base file is the encoder's as it started, the
    trained LayerNorms beside it; the count of what trains in the log; best/ read back unmerged scores
    what training scored; a --resume with another bottleneck size refused."""
    straight, part = tmp_path / "straight", tmp_path / "part"
    houlsby = ("--peft", "houlsby", "--peft-bottleneck", "4")
    capsys.readouterr()
    summary = run(tiny_bert_dir, data_dir, straight, 4, *houlsby, "--progress", "lines")
    line = next(l for l in capsys.readouterr().err.splitlines() if "parameters" in l)
    run(tiny_bert_dir, data_dir, part, 2, *houlsby)
    assert quiet_multitask(["--resume", "--out-dir", str(part), "--steps", "4"])["step"] == 4
    files = ("model.safetensors", "heads.safetensors", HOULSBY_WEIGHTS)
    a, b = ({f"{n}/{k}": v for n in files for k, v in load_file(str(out / "last" / n)).items()} for out in (straight,
                                                                                                            part))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = load_file(str(tiny_bert_dir / "model.safetensors"))
    assert all(torch.equal(v, base[k]) for k, v in load_file(str(straight / "last" / "model.safetensors")).items())
    own = load_file(str(straight / "last" / HOULSBY_WEIGHTS))
    assert all(v.abs().max() > 0 for k, v in own.items() if k.endswith("up.weight"))  # trained (W_up starts at 0)
    assert not torch.equal(own["encoder.layer.1.output.LayerNorm.bias"], base["encoder.layer.1.output.LayerNorm.bias"])
    state = torch.load(straight / "last" / "training_state.pt", weights_only=False)
    assert len(state["optimizer"]["state"]) == len(own) + 2 * 3  # and each head's weight and bias
    assert (part / "predictions" / "sst-dev-output.csv").read_bytes() == \
        (straight / "predictions" / "sst-dev-output.csv").read_bytes()

    best = MultitaskModel.from_pretrained(straight / "best")
    assert isinstance(best.encoder.adapters, HoulsbyAdapters) and not best.per_task_adapters
    assert summary["metrics"]["mean_dev"] == pytest.approx(summary["best"], abs=1e-6)
    heads = sum(v.numel() for v in best.heads_state_dict().values())
    assert f"trains {heads + sum(v.numel() for v in own.values()):,} of" in line
    assert "houlsby m 4" in line and "4 sublayer outputs" in line
    refused(["--resume", "--out-dir", part, "--peft-bottleneck", "8"], capsys, "--peft-bottleneck is 8 here, 4 in")
