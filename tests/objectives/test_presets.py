"""run_pretrain.py --preset NAME (the methods as their papers published them) and the options they
need: --negatives, --span-unit char / --span-chars, --pooling cls-mlp."""
from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import base_args, load, run_quiet, training_state
from safetensors.torch import load_file

from bertcf import SentenceEncoder
from bertcf.data.corpus import CORPUS_SETTINGS
from bertcf.errors import UsageError
from bertcf.objectives import Mirror, presets
from bertcf.objectives.contrastive import char_span_mask

CORPUS_SENTENCES = 40  # conftest's data_dir corpus

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread


def config(out) -> dict:
    return json.loads((out / "config.json").read_text())


def without(argv: list[str], *flags: str) -> list[str]:
    """argv without the given flags and their values (so a preset sets them)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        else:
            out.append(a)
    return out


def test_a_preset_sets_the_papers_values_and_a_flag_wins(tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "simcse"
    argv = without(base_args(tiny_bert_dir, data_dir, out), "--steps", "--batch-size", "--max-length")
    run_quiet(argv + ["--preset", "simcse-unsup", "--lr", "1e-3", "--batch-size", "16"])
    c = config(out)
    assert c["preset"] == "simcse-unsup"
    assert (c["method"], c["negatives"], c["pooling"], c["temperature"], c["max_length"]) == (
        "simcse", "simcse", "cls-mlp", 0.05, 32)
    assert (c["lr"], c["batch_size"]) == (1e-3, 16)  # given here: the flags win
    assert "lr" not in c["preset_values"] and "batch_size" not in c["preset_values"]
    assert c["steps"] == math.ceil(CORPUS_SENTENCES / 16) == c["preset_values"]["steps"]  # one epoch
    assert c["preset_values"]["negatives"] == "simcse"
    assert "note: --preset simcse-unsup" in capsys.readouterr().err
    # --resume goes on with what the preset set, not the preset anew
    run_quiet(["--resume", "--out-dir", str(out), "--steps", str(c["steps"] + 1)])
    assert config(out)["preset_values"] == c["preset_values"] and config(out)["lr"] == 1e-3


@pytest.mark.parametrize("name", sorted(n for n, p in presets.PRESETS.items()  # supervised: test_supervised.py
                                         if p.values.get("stage") != "supervised"))
def test_every_preset_runs(name, tiny_bert_dir, data_dir, tmp_path):
    out = tmp_path / name
    argv = without(base_args(tiny_bert_dir, data_dir, out), "--batch-size", "--max-length") + [
        "--preset", name, "--batch-size", "4", "--steps", "2", "--eval-every", "2"]
    summary, _ = run_quiet(argv)
    assert summary["step"] == 2
    preset = presets.PRESETS[name]
    c = config(out)
    for key, value in preset.values.items():
        if key not in ("batch_size", "eval_every") and key not in CORPUS_SETTINGS:  # --corpus given here wins
            assert c[key] == value, key
    assert SentenceEncoder.from_pretrained(out / "best").pooling == ("cls" if c["pooling"] == "cls-mlp"
                                                                     else c["pooling"])


def test_cls_mlp_trains_an_mlp_that_the_checkpoint_leaves_out(tiny_bert_dir, data_dir, tmp_path):
    """SimCSE's head: an MLP over [CLS] in training, kept in last/ for --resume; best/ encodes with
    [CLS] and holds no MLP."""
    out = tmp_path / "mlp"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, method="simcse", pooling="cls-mlp", lr=1e-3))
    state = training_state(out)
    assert set(state["modules"]) == {"encoder", "mlp"} and "0.weight" in state["modules"]["mlp"]
    weights = load_file(str(out / "best" / "model.safetensors"))
    assert not any("mlp" in k for k in weights)
    encoder = SentenceEncoder.from_pretrained(out / "best")
    assert encoder.pooling == "cls"
    with pytest.raises(UsageError, match="mlp=True .* needs an encoder that pools cls, not mean"):
        Mirror(load(tiny_bert_dir), mlp=True)  # refused, not switched to [CLS] behind the caller's back
    enc = SentenceEncoder.from_pretrained(tiny_bert_dir, pooling="cls", hidden_dropout_prob=0.0,
                                          attention_probs_dropout_prob=0.0)
    objective = Mirror(enc, mlp=True)
    ids = enc.tokenizer(["a man plays", "the dog runs"], padding=True, return_tensors="pt")
    u = enc.embed(ids["input_ids"], ids["attention_mask"])
    assert torch.allclose(u, enc.bert(ids["input_ids"], ids["attention_mask"])["last_hidden_state"][:, 0])
    assert torch.allclose(objective.mlp(u), torch.tanh(u @ objective.mlp[0].weight.T + objective.mlp[0].bias))


def test_cls_mlp_is_for_the_mirror_stage(tiny_bert_dir, data_dir, tmp_path, capsys):
    from bertcf.cli import run_main
    from bertcf.commands.pretrain import run as main
    assert run_main(main, base_args(tiny_bert_dir, data_dir, tmp_path / "x", stage="joint", pooling="cls-mlp")) == 2
    assert "--pooling cls-mlp (SimCSE's training head) is for --stage mirror" in capsys.readouterr().err


def test_char_span_masks_five_characters_of_a_long_sentence_only():
    g = torch.Generator().manual_seed(0)
    long = "The quick brown fox jumps over the lazy dog."
    for _ in range(50):
        masked = char_span_mask(long, 5, "[MASK]", g)
        left, right = masked.split(" [MASK] ")
        assert long.startswith(left) and long.endswith(right) and len(left) + len(right) == len(long) - 5
    assert char_span_mask("Too short to mask here.", 5, "[MASK]", g) == "Too short to mask here."  # < 30 chars


def test_mirror_with_char_spans_tokenises_the_masked_text(tiny_bert_dir):
    """--span-unit char: the second view is the masked text, tokenised; the first the sentence itself."""
    enc = load(tiny_bert_dir)
    objective = Mirror(enc, span_unit="char", span_chars=5, max_length=32, generator=torch.Generator().manual_seed(1))
    texts = ["the man is playing a guitar in the morning", "a woman reads a book in the park today"]
    seen = []
    objective.embed = lambda ids, mask: seen.append((ids, mask)) or torch.randn(ids.shape[0], enc.dim)
    tokens = enc.tokenizer(texts, padding=True, return_tensors="pt")
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    objective.loss(ids, mask, torch.zeros_like(ids), texts=texts)
    (both, both_mask), = seen
    decoded = [enc.tokenizer.decode(row[m.bool()], skip_special_tokens=False) for row, m in zip(both, both_mask)]
    assert decoded[:2] == [f"[CLS] {t} [SEP]" for t in texts]
    assert all("[MASK]" in d for d in decoded[2:])
