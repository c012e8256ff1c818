"""run_pretrain.py --peft (a LoRA'd stage 1, bertcf/models/peft.py): the encoder's weights stay, the
adapter trains and is saved beside them; --merge writes merged/, equal to best/ read back; --resume
continues bit for bit; the stages that train no adapter refuse it in one line. --peft houlsby
(bertcf/models/bottleneck.py): its adapters and LayerNorms train beside the unchanged base, best/ reads
back unmerged, --merge refused."""
from __future__ import annotations

import pytest
import torch
from helpers import base_args, exit_status, run_quiet, tensors

pytest.importorskip("peft", reason="peft is an optional extra: pip install -e '.[peft]'")

from bertcf.models import peft as adapters  # noqa: E402
from bertcf.models.encoder import SentenceEncoder  # noqa: E402
from bertcf.models.bottleneck import HOULSBY_WEIGHTS, HoulsbyAdapters  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SENTENCES = ["a man plays the guitar .", "the dog runs on the beach", "two women talk about the film"]


def test_lora_stage1_trains_the_adapter_alone_and_merges(tiny_bert_dir, data_dir, tmp_path):
    out = tmp_path / "run"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=3, stage="mirror", peft="dora", merge=True, lr=1e-2,
                         select_on="last"))  # best/ the last step: the adapter has trained
    assert adapters.has_adapter(out / "best") and not adapters.has_adapter(out / "merged")
    base = tensors(tiny_bert_dir / "model.safetensors")
    for k, v in tensors(out / "last" / "model.safetensors").items():
        assert torch.equal(v, base[k]), k
    trained = tensors(out / "last" / adapters.ADAPTER_WEIGHTS)
    assert trained and all("lora_" in k for k in trained)
    best, merged = SentenceEncoder.from_pretrained(out / "best"), SentenceEncoder.from_pretrained(out / "merged")
    start = torch.as_tensor(SentenceEncoder.from_pretrained(tiny_bert_dir).encode(SENTENCES))
    vectors = torch.as_tensor(best.encode(SENTENCES))
    torch.testing.assert_close(torch.as_tensor(merged.encode(SENTENCES)), vectors, atol=1e-5, rtol=1e-5)
    assert (vectors - start).abs().max() > 1e-4  # the adapter trained


def test_houlsby_stage1_trains_its_adapters_and_reads_back_unmerged(tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=3, stage="mirror", peft="houlsby", peft_bottleneck=4,
                        lr=1e-2, select_on="last"))
    base = tensors(tiny_bert_dir / "model.safetensors")
    assert all(torch.equal(v, base[k]) for k, v in tensors(out / "last" / "model.safetensors").items())
    assert all(v.abs().max() > 0 for k, v in tensors(out / "last" / HOULSBY_WEIGHTS).items() if k.endswith("up.weight"))
    best = SentenceEncoder.from_pretrained(out / "best")
    assert isinstance(best.adapters, HoulsbyAdapters)
    start = torch.as_tensor(SentenceEncoder.from_pretrained(tiny_bert_dir).encode(SENTENCES))
    assert (torch.as_tensor(best.encode(SENTENCES)) - start).abs().max() > 1e-4
    capsys.readouterr()
    assert exit_status(base_args(tiny_bert_dir, data_dir, tmp_path / "m", stage="mirror", peft="houlsby",
                                 merge=True)) == 2
    assert "--merge does not apply to --peft houlsby" in capsys.readouterr().err


def test_resume_is_bit_identical(tiny_bert_dir, data_dir, tmp_path):
    straight, part = tmp_path / "straight", tmp_path / "part"
    run_quiet(base_args(tiny_bert_dir, data_dir, straight, steps=6, stage="mirror", peft="lora", lr=1e-2))
    run_quiet(base_args(tiny_bert_dir, data_dir, part, steps=3, stage="mirror", peft="lora", lr=1e-2))
    run_quiet(["--resume", "--out-dir", str(part), "--steps", "6"])
    for name in ("model.safetensors", adapters.ADAPTER_WEIGHTS):
        a, b = tensors(straight / "last" / name), tensors(part / "last" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.parametrize("flags, needle", [(dict(stage="flow"), "--stage flow"),
                                           (dict(stage="joint"), "--stage joint"),
                                           (dict(stage="mirror", method="ct"), "--method ct"),
                                           (dict(stage="mirror", peft_targets="nothing"), "matches no module")])
def test_stages_without_an_adapter_refuse_it(tiny_bert_dir, data_dir, tmp_path, capsys, flags, needle):
    capsys.readouterr()
    assert exit_status(base_args(tiny_bert_dir, data_dir, tmp_path / "run", peft="lora", **flags)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
