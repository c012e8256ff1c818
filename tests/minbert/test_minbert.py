"""minBERT against transformers.BertModel: numerics, padding, checkpoints, tokeniser, dropout.

Random-weight reference models are tiny (vocabulary 100, hidden <= 64) so the file runs in a few
seconds on one core; every weight (biases and LayerNorm parameters included) is drawn at a
scale where attention is far from uniform, so a wrong mapping or a wrong mask cannot hide.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers import offline_hub_cache
from safetensors.torch import load_file, save_file

import minbert
from minbert import BertModel, CheckpointError

VOCAB = 100
TOL = 1e-5

CONFIGS = {
    "h32-l2-gelu": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                        hidden_act="gelu", layer_norm_eps=1e-12),
    "h48-l3-gelu_new": dict(hidden_size=48, num_attention_heads=3, num_hidden_layers=3, intermediate_size=80,
                            hidden_act="gelu_new", layer_norm_eps=1e-6),
    "h16-l1-1head": dict(hidden_size=16, num_attention_heads=1, num_hidden_layers=1, intermediate_size=16,
                         hidden_act="gelu", layer_norm_eps=1e-5, type_vocab_size=3),
    "h64-l2-8heads-narrow-ffn": dict(hidden_size=64, num_attention_heads=8, num_hidden_layers=2,
                                     intermediate_size=24, hidden_act="gelu_new", layer_norm_eps=1e-12),
}


def hf_config(**overrides) -> transformers.BertConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                    intermediate_size=64, max_position_embeddings=40, type_vocab_size=2, pad_token_id=0)
    return transformers.BertConfig(**{**settings, **overrides})


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> torch.nn.Module:
    """Every parameter random: weights and biases ~ N(0, std), LayerNorm weights ~ N(1, std)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(noise + 1.0 if name.endswith("LayerNorm.weight") else noise)
    return model.eval()


def save_hf(directory, cls=transformers.BertModel, seed: int = 0, **config):
    """A random-weight transformers model of class ``cls`` saved with save_pretrained."""
    torch.manual_seed(seed)
    model = randomize_(cls(hf_config(**config)), seed)
    model.save_pretrained(str(directory))
    return model


def padded_batch(seed: int = 0, lengths=(11, 7, 1, 4), vocab: int = VOCAB, type_vocab: int = 2):
    """input_ids, attention_mask, token_type_ids [b, max(lengths)]: random ids, zero padding, a
    second segment (token type 1, or up to type_vocab - 1) in the second half of each sentence."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    ids = torch.randint(1, vocab, (b, t), generator=g)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()
    types = torch.zeros(b, t, dtype=torch.long)
    for i, n in enumerate(lengths):
        types[i, n // 2:n] = 1 + i % (type_vocab - 1)
    return ids * mask, mask, types


def valid(x, mask):
    """The rows of a [b, t, D] tensor at real-token positions: [n_valid, D]."""
    return x[mask.bool()]


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


@pytest.fixture
def hf_dir(tmp_path):
    """A random BertModel checkpoint (the first config) and the model itself."""
    model = save_hf(tmp_path / "hf", **CONFIGS["h32-l2-gelu"])
    return tmp_path / "hf", model


# ----------------------------------------------------------------------------- numerics

@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_transformers(tmp_path, name, attn):
    config = CONFIGS[name]
    save_hf(tmp_path, seed=len(name), **config)
    hf = transformers.BertModel.from_pretrained(str(tmp_path), attn_implementation=attn).eval()
    ours = BertModel.from_pretrained(tmp_path).eval()
    assert ours.config.hidden_act == config["hidden_act"]
    assert ours.config.layer_norm_eps == config["layer_norm_eps"]
    ids, mask, types = padded_batch(seed=1, type_vocab=config.get("type_vocab_size", 2))
    assert (mask == 0).any() and (types[mask.bool()] > 0).any()  # padding and a second segment
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        out = ours(ids, mask, types, output_hidden_states=True)
    assert out["last_hidden_state"].dtype == torch.float32
    assert out["last_hidden_state"].shape == ref.last_hidden_state.shape
    assert max_diff(valid(out["last_hidden_state"], mask), valid(ref.last_hidden_state, mask)) < TOL
    assert max_diff(out["pooler_output"], ref.pooler_output) < TOL
    assert len(out["hidden_states"]) == len(ref.hidden_states) == config["num_hidden_layers"] + 1
    for layer, (a, b) in enumerate(zip(out["hidden_states"], ref.hidden_states)):
        assert max_diff(valid(a, mask), valid(b, mask)) < TOL, f"hidden state {layer}"
    # The outputs are not trivially alike across positions (attention is far from uniform).
    assert out["last_hidden_state"][0, :11].std(0).mean() > 0.1


def test_defaults_without_mask_and_token_types(hf_dir):
    directory, hf = hf_dir
    ours = BertModel.from_pretrained(directory).eval()
    ids = padded_batch(lengths=(9, 9))[0]
    with torch.no_grad():
        ref = hf(input_ids=ids)
        out = ours(ids)
    assert set(out) == {"last_hidden_state", "pooler_output"}
    assert max_diff(out["last_hidden_state"], ref.last_hidden_state) < TOL
    assert max_diff(out["pooler_output"], ref.pooler_output) < TOL


def test_padding_content_is_ignored(hf_dir):
    directory, _ = hf_dir
    ours = BertModel.from_pretrained(directory).eval()
    ids, mask, types = padded_batch(seed=3)
    g = torch.Generator().manual_seed(4)
    other_ids = torch.where(mask.bool(), ids, torch.randint(1, VOCAB, ids.shape, generator=g))
    other_types = torch.where(mask.bool(), types, torch.ones_like(types))
    assert not torch.equal(other_ids, ids)
    with torch.no_grad():
        a = ours(ids, mask, types)
        b = ours(other_ids, mask, other_types)
        # Extra padding columns change nothing either.
        c = ours(torch.cat([ids, torch.full((4, 5), 7)], 1), torch.cat([mask, torch.zeros(4, 5, dtype=torch.long)], 1),
                 torch.cat([types, torch.zeros(4, 5, dtype=torch.long)], 1))
    assert max_diff(valid(a["last_hidden_state"], mask), valid(b["last_hidden_state"], mask)) < 1e-6
    assert max_diff(a["pooler_output"], b["pooler_output"]) < 1e-6
    assert max_diff(valid(a["last_hidden_state"], mask), valid(c["last_hidden_state"][:, :ids.shape[1]], mask)) < 1e-5
    assert max_diff(a["pooler_output"], c["pooler_output"]) < 1e-5


@pytest.mark.parametrize("by_length", [True, False], ids=["length-groups", "one-group"])
def test_unpadded_forward_equals_padded(hf_dir, monkeypatch, by_length):
    """A batch with padding runs unpadded (real tokens only): the same values and gradients as
    computing the padding too, zeros at the padding; with a mask that has holes too. Attention
    runs over length groups of sentences (the CPU's choice) or one group padded to the batch's
    width (the GPU's when flash attention cannot run)."""
    from minbert.model import Packing

    packings = []
    from_mask = Packing.from_mask

    def kept(cls, *args, **kwargs):
        packings.append(from_mask(*args, **kwargs))
        return packings[-1]
    monkeypatch.setattr(Packing, "from_mask", classmethod(kept))
    directory, hf = hf_dir
    ours = BertModel.from_pretrained(directory, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours.attend_by_length = by_length
    ids, mask, types = padded_batch(seed=7, lengths=(11, 7, 1, 4, 11))
    mask[4, 3:6] = 0  # a hole in the middle of a sentence: positions stay the columns
    real = mask.bool()
    outputs, grads = {}, {}
    for unpad in (True, False):
        ours.zero_grad()
        out = ours(ids, mask, types, unpad=unpad)
        (valid(out["last_hidden_state"], mask).square().mean() + out["pooler_output"].sum()).backward()
        outputs[unpad], grads[unpad] = out, {n: p.grad.clone() for n, p in ours.named_parameters()}
    groups = packings[0].groups
    # Real lengths 11, 7, 1, 4 and 8 (the hole): groups of 11 | 8, 7 | 4 | 1, or all five at width 11.
    assert [g.key_mask.shape[0] for g in groups] == ([1, 2, 1, 1] if by_length else [5])
    assert [g.key_mask.shape[-1] for g in groups] == ([11, 8, 4, 1] if by_length else [11])
    a, b = outputs[True], outputs[False]
    assert max_diff(valid(a["last_hidden_state"], mask), valid(b["last_hidden_state"], mask)) < 1e-6
    assert max_diff(a["pooler_output"], b["pooler_output"]) < 1e-6
    assert (a["last_hidden_state"][~real] == 0).all() and (b["last_hidden_state"][~real] != 0).any()
    for name, g in grads[False].items():
        assert max_diff(grads[True][name], g) < 1e-5 * max(1.0, g.abs().max().item()), name
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        counted = ours(ids, mask, types, num_tokens=int(mask.sum()))  # no nonzero(): the count is given
    assert max_diff(valid(a["last_hidden_state"], mask), valid(ref.last_hidden_state, mask)) < TOL
    assert torch.equal(counted["last_hidden_state"], a["last_hidden_state"].detach())


def test_length_groups():
    from minbert.model import length_groups

    lengths = [12, 3, 40, 9, 31, 30, 4, 16, 12, 39, 1]
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))  # each sentence once
    longest = [lengths[g[0]] for g in groups]
    assert longest == sorted(longest, reverse=True)
    for g in groups:
        assert lengths[g[0]] == max(lengths[i] for i in g)
        assert all(lengths[i] >= 0.75 * lengths[g[0]] for i in g)
    assert [[lengths[i] for i in g] for g in groups] == [[40, 39, 31, 30], [16, 12, 12], [9], [4, 3], [1]]
    assert length_groups([5, 5, 5]) == [[0, 1, 2]] and length_groups([]) == []


needs_flash = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
    reason="needs a CUDA GPU with flash attention (compute capability 8.0+)")


@needs_flash
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_unpadded_on_cuda_flash_attention_and_compile(hf_dir, monkeypatch, dtype):
    """On a GPU: in bf16, flash attention over the packed sentences, and the padded attention
    where flash cannot run (one group at the batch's width); in fp32, that padded attention
    alone. Each gives what the padded model gives, forward and backward; BertModel.compile
    (layer by layer, dynamic shapes) changes no value."""
    tol = 0.05 if dtype == torch.bfloat16 else 1e-4
    directory, hf = hf_dir
    ours = BertModel.from_pretrained(directory, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).cuda()
    hf = hf.cuda()
    ids, mask, types = (x.cuda() for x in padded_batch(seed=8, lengths=(11, 7, 1, 4)))
    flash_attention, calls = minbert.model.flash_attention, []

    def counted_flash_attention(*args):
        calls.append(1)
        return flash_attention(*args)
    monkeypatch.setattr(minbert.model, "flash_attention", counted_flash_attention)

    def autocast():
        return torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32)

    def run(**kwargs):
        ours.zero_grad()
        with autocast():
            out = ours(ids, mask, types, **kwargs)
        (valid(out["last_hidden_state"], mask).float().square().mean() + out["pooler_output"].float().sum()).backward()
        return out["last_hidden_state"].float(), {n: p.grad.clone() for n, p in ours.named_parameters()}

    ref_hidden, ref_grads = run(unpad=False)
    for flash in ((True, False) if dtype == torch.bfloat16 else (False,)):
        if not flash:
            monkeypatch.setattr(minbert.model, "flash_attention_runs", lambda *args: False)
        calls.clear()
        hidden, grads = run(num_tokens=int(mask.sum()))
        assert len(calls) == (ours.config.num_hidden_layers if flash else 0)
        assert max_diff(valid(hidden, mask), valid(ref_hidden, mask)) < tol
        for name, g in ref_grads.items():
            assert max_diff(grads[name], g) < tol * max(1.0, g.abs().max().item()), name
    monkeypatch.undo()
    with torch.no_grad(), autocast():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state.float()
        ours.eval()
        eager = ours(ids, mask, types)["last_hidden_state"].float()
        ours.compile_layers()
        compiled = ours(ids, mask, types)["last_hidden_state"].float()
        shorter = ours(ids[1:, :7], mask[1:, :7], types[1:, :7])["last_hidden_state"].float()  # another shape
    assert max_diff(valid(eager, mask), valid(expected, mask)) < tol
    assert max_diff(valid(compiled, mask), valid(eager, mask)) < tol
    assert max_diff(valid(shorter, mask[1:, :7]), valid(eager[1:, :7], mask[1:, :7])) < tol
    ours.train()  # compiled, with dropout (flash attention's included): runs, finite gradients
    with autocast():
        out = ours(ids, mask, types)["pooler_output"]
    out.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters() if p.grad is not None)


@needs_flash
def test_flash_attention_dropout_matches_explicit_attention_with_its_mask():
    """flash_attention with dropout p is softmax(q k^T / sqrt(d)) * keep / (1 - p) @ v per
    sentence, and its backward uses the same keep mask. The mask is read out of the kernel:
    with the same seed, attending over one-hot values returns the dropped, rescaled
    probabilities themselves."""
    from minbert.model import flash_attention

    p, heads, d, lengths = 0.3, 2, 64, [37, 5, 64, 20]  # one-hot values need lengths <= d
    gen = torch.Generator().manual_seed(0)
    cu = F.pad(torch.tensor(lengths).cumsum(0), (1, 0))
    total, longest = sum(lengths), max(lengths)
    q, k, v, grad_out = (torch.randn(total, heads, d, generator=gen).to("cuda", torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    slot = torch.cat([torch.arange(n) for n in lengths])  # a token's place in its sentence
    one_hot = F.one_hot(slot, d)[:, None, :].expand(total, heads, d).to("cuda", torch.bfloat16)
    cu_cuda = cu.int().cuda()
    torch.cuda.manual_seed(123)
    with torch.no_grad():
        probs = flash_attention(q, k, one_hot, cu_cuda, longest, p).float()  # row i, slot j: A[i, j]
    torch.cuda.manual_seed(123)
    out = flash_attention(q, k, v, cu_cuda, longest, p)
    (out.float() * grad_out.float()).sum().backward()
    kept = total_entries = 0
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        n = b - a
        dropped = probs[a:b, :, :n].transpose(0, 1)  # [heads, n, n]
        keep = dropped != 0
        kept, total_entries = kept + keep.sum().item(), total_entries + keep.numel()
        qs, ks, vs = (x.detach()[a:b].float().transpose(0, 1).requires_grad_() for x in (q, k, v))
        attention = torch.softmax(qs @ ks.transpose(1, 2) / d ** 0.5, dim=-1)
        assert max_diff(dropped, (attention * keep / (1 - p)).detach()) < 0.02
        ref = (attention * keep / (1 - p)) @ vs  # [heads, n, d]
        assert max_diff(out[a:b].float().transpose(0, 1), ref) < 0.05
        ref.backward(grad_out[a:b].float().transpose(0, 1))
        for x, xs in ((q, qs), (k, ks), (v, vs)):
            expected = xs.grad.transpose(0, 1)
            assert max_diff(x.grad[a:b].float(), expected) < 0.05 * max(1.0, expected.abs().max().item())
    assert abs(kept / total_entries - (1 - p)) < 0.03  # dropout happened, at rate p


def test_dropout_only_in_train_mode(hf_dir):
    directory, _ = hf_dir
    ours = BertModel.from_pretrained(directory)
    assert ours.config.hidden_dropout_prob > 0 and ours.config.attention_probs_dropout_prob > 0
    ids, mask, types = padded_batch()
    ours.train()
    with torch.no_grad():
        a, b = ours(ids, mask, types), ours(ids, mask, types)
    assert max_diff(a["last_hidden_state"], b["last_hidden_state"]) > 1e-3
    ours.eval()
    with torch.no_grad():
        a, b = ours(ids, mask, types), ours(ids, mask, types)
    assert torch.equal(a["last_hidden_state"], b["last_hidden_state"])
    assert torch.equal(a["pooler_output"], b["pooler_output"])


def test_train_mode_gradients_reach_every_parameter(hf_dir):
    directory, _ = hf_dir
    ours = BertModel.from_pretrained(directory).train()
    ids, mask, types = padded_batch()
    out = ours(ids, mask, types)
    (out["last_hidden_state"].square().mean() + out["pooler_output"].sum()).backward()
    no_grad = [n for n, p in ours.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert no_grad == []


# ----------------------------------------------------------------------------- save / load

def test_save_pretrained_round_trip(hf_dir, tmp_path):
    directory, _ = hf_dir
    ours = BertModel.from_pretrained(directory).eval()
    out_dir = tmp_path / "saved"
    ours.save_pretrained(out_dir)
    assert (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file()
    assert not list(out_dir.glob("*.tmp"))
    hf, info = transformers.BertModel.from_pretrained(str(out_dir), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info.get("mismatched_keys")
    hf.eval()
    again = BertModel.from_pretrained(out_dir).eval()
    assert again.config == ours.config
    own, loaded = ours.state_dict(), again.state_dict()
    assert own.keys() == loaded.keys() and all(torch.equal(own[k], loaded[k]) for k in own)
    ids, mask, types = padded_batch(seed=5)
    with torch.no_grad():
        a, b, ref = ours(ids, mask, types), again(ids, mask, types), hf(input_ids=ids, attention_mask=mask,
                                                                        token_type_ids=types)
    assert torch.equal(a["last_hidden_state"], b["last_hidden_state"])
    assert torch.equal(a["pooler_output"], b["pooler_output"])
    assert max_diff(valid(a["last_hidden_state"], mask), valid(ref.last_hidden_state, mask)) < TOL
    assert max_diff(a["pooler_output"], ref.pooler_output) < TOL


def test_config_overrides(hf_dir):
    directory, _ = hf_dir
    ours = BertModel.from_pretrained(directory, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    assert ours.config.hidden_dropout_prob == 0.0
    with pytest.raises(TypeError, match="hidden_dropout"):  # a misspelt setting is not silently ignored
        BertModel.from_pretrained(directory, hidden_dropout=0.0)
    ids, mask, types = padded_batch()
    ours.train()
    with torch.no_grad():
        assert torch.equal(ours(ids, mask, types)["last_hidden_state"], ours(ids, mask, types)["last_hidden_state"])


@pytest.mark.parametrize("cls", [transformers.BertForMaskedLM, transformers.BertForPreTraining])
def test_loads_checkpoints_with_heads(tmp_path, capsys, cls):
    full = save_hf(tmp_path, cls=cls, **CONFIGS["h32-l2-gelu"])
    keys = load_file(str(tmp_path / "model.safetensors")).keys()
    assert all(k.startswith(("bert.", "cls.")) for k in keys) and any(k.startswith("cls.") for k in keys)
    capsys.readouterr()
    ours = BertModel.from_pretrained(tmp_path).eval()
    printed = capsys.readouterr().out.strip().splitlines()
    notes = [line for line in printed if line.startswith("minbert: ignored")]
    assert len(notes) == 1 and "cls.predictions" in notes[0], printed
    assert all(line.startswith("minbert:") for line in printed), printed  # one line per note, nothing else
    has_pooler = cls is transformers.BertForPreTraining
    assert any("no pooler" in line for line in printed) == (not has_pooler)
    ids, mask, types = padded_batch(seed=6)
    with torch.no_grad():
        ref = full.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
        out = ours(ids, mask, types)
    assert max_diff(valid(out["last_hidden_state"], mask), valid(ref.last_hidden_state, mask)) < TOL
    if has_pooler:
        assert max_diff(out["pooler_output"], ref.pooler_output) < TOL


def _write_checkpoint(directory, state: dict, config: transformers.BertConfig, bin_format: bool = False):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config.to_dict()))
    if bin_format:
        torch.save(state, directory / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    return directory


def test_missing_key_raises(hf_dir, tmp_path):
    _, hf = hf_dir
    state = dict(hf.state_dict())
    del state["encoder.layer.1.output.dense.bias"]
    del state["pooler.dense.bias"]  # the pooler half present: not a "no pooler" checkpoint
    bad = _write_checkpoint(tmp_path / "bad", state, hf.config)
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(bad)
    message = str(e.value)
    assert "missing" in message and "encoder.layer.1.output.dense.bias" in message
    assert "pooler.dense.bias" in message and "\n" not in message


def test_wrong_shape_raises(hf_dir, tmp_path):
    _, hf = hf_dir
    state = dict(hf.state_dict())
    state["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(63, 32)
    bad = _write_checkpoint(tmp_path / "bad", state, hf.config)
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(bad)
    message = str(e.value)
    assert "encoder.layer.0.intermediate.dense.weight" in message and "(63, 32)" in message and "(64, 32)" in message


def test_pytorch_model_bin_and_tf_names_load(hf_dir, tmp_path):
    _, hf = hf_dir
    state = {("bert." + k).replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in hf.state_dict().items()}
    directory = _write_checkpoint(tmp_path / "bin", state, hf.config, bin_format=True)
    assert not (directory / "model.safetensors").exists()
    ours = BertModel.from_pretrained(directory).eval()
    ids, mask, types = padded_batch(seed=7)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        out = ours(ids, mask, types)
    assert max_diff(valid(out["last_hidden_state"], mask), valid(ref.last_hidden_state, mask)) < TOL
    assert max_diff(out["pooler_output"], ref.pooler_output) < TOL


def test_missing_local_paths_raise(tmp_path, hf_dir):
    for path in (tmp_path / "does-not-exist", "./no-such-checkpoint-dir"):
        with pytest.raises(CheckpointError, match="not found"):
            BertModel.from_pretrained(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        BertModel.from_pretrained(empty)
    no_weights = tmp_path / "config-only"
    no_weights.mkdir()
    shutil.copy(hf_dir[0] / "config.json", no_weights)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        minbert.model.resolve_checkpoint(no_weights)  # weights asked for explicitly
    # from_pretrained of a config-only directory: random weights (pretraining from scratch), seeded.
    torch.manual_seed(5)
    a = BertModel.from_pretrained(no_weights)
    torch.manual_seed(5)
    b = BertModel.from_pretrained(no_weights, hidden_dropout_prob=0.0)
    assert a.config.hidden_size == hf_dir[1].config.hidden_size and b.config.hidden_dropout_prob == 0.0
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.embeddings.word_embeddings.weight, hf_dir[1].embeddings.word_embeddings.weight)
    with pytest.raises(CheckpointError, match="is a file; pass the checkpoint directory"):
        BertModel.from_pretrained(hf_dir[0] / "model.safetensors")


def test_loads_a_hub_name_from_the_hub_cache(monkeypatch, tmp_path, tiny_bert_dir, capsys):
    name = "bertcf-test-user/tiny-bert"
    offline_hub_cache(monkeypatch, tmp_path, name, tiny_bert_dir)
    from_hub = BertModel.from_pretrained(name)
    from_dir = BertModel.from_pretrained(tiny_bert_dir)
    a, b = from_hub.state_dict(), from_dir.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    text = ["The capital of France is [MASK].", "a man plays the guitar"]
    assert minbert.load_tokenizer(name)(text)["input_ids"] == minbert.load_tokenizer(tiny_bert_dir)(text)["input_ids"]


def test_unknown_hub_name_raises_offline(monkeypatch):
    import huggingface_hub.constants

    # huggingface_hub reads HF_HUB_OFFLINE when imported, so set the constant as well.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    name = "bertcf-no-such-user/no-such-bert-model"
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(name)
    message = str(e.value)
    assert name in message and "hub" in message and "\n" not in message


def test_unsupported_config_raises(tmp_path):
    config = hf_config(position_embedding_type="relative_key").to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="relative_key"):
        BertModel.from_pretrained(tmp_path)


# ----------------------------------------------------------------------------- real checkpoint

REAL_SENTENCES = [
    "A man is playing a guitar.",
    "The capital of France is Paris.",
    "It 's a lovely film with lovely performances by Buy and Accorsi .",
    "Two black dogs are playing in a grassy plain, chasing each other around while their owner watches.",
    "Hi",
]


def test_real_checkpoint_matches_transformers(real_bert_dir, capsys):
    tokenizer = minbert.load_tokenizer(real_bert_dir)
    batch = minbert.tokenize(tokenizer, REAL_SENTENCES, max_length=128)
    mask = batch["attention_mask"]
    assert (mask == 0).any()  # padding included
    batch["token_type_ids"][0, 3:] = 1  # a second segment too
    batch["token_type_ids"] *= mask
    # float(): transformers 5 keeps a half-precision checkpoint in half precision; minBERT loads float32
    hf = transformers.BertModel.from_pretrained(str(real_bert_dir)).float().eval()
    ours = BertModel.from_pretrained(real_bert_dir).eval()
    with torch.no_grad():
        ref = hf(**batch)
        out = ours(batch["input_ids"], mask, batch["token_type_ids"])
    diff_hidden = max_diff(valid(out["last_hidden_state"], mask), valid(ref.last_hidden_state, mask))
    diff_pooler = max_diff(out["pooler_output"], ref.pooler_output)
    with capsys.disabled():
        print(f"\n[{real_bert_dir}] max |minBERT - transformers|: last_hidden_state {diff_hidden:.3g}, "
              f"pooler_output {diff_pooler:.3g}")
    assert diff_hidden < TOL and diff_pooler < TOL


# ----------------------------------------------------------------------------- tokeniser

def test_tokenizer_ids(real_vocab_path):
    tokenizer = minbert.load_tokenizer(real_vocab_path)
    ids = minbert.tokenize(tokenizer, ["The capital of France is [MASK]."], max_length=32)["input_ids"]
    assert ids.tolist() == [[101, 1996, 3007, 1997, 2605, 2003, 103, 1012, 102]]


def test_tokenize_pads_to_longest_in_batch(vocab_path):
    tokenizer = minbert.load_tokenizer(vocab_path)
    short = minbert.tokenize(tokenizer, ["a man", "a man is playing"], max_length=64)
    assert set(short) >= {"input_ids", "attention_mask", "token_type_ids"}
    assert short["input_ids"].shape == (2, 6)  # [CLS] a man is playing [SEP]
    assert short["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]
    assert short["input_ids"][0, 4:].tolist() == [tokenizer.pad_token_id] * 2
    assert (short["token_type_ids"] == 0).all()
    single = minbert.tokenize(tokenizer, ["a man"], max_length=64)
    assert single["input_ids"].shape == (1, 4)  # never padded to max_length


def test_tokenize_truncates(vocab_path):
    tokenizer = minbert.load_tokenizer(vocab_path)
    long = " ".join(["the man is playing a guitar"] * 10)
    batch = minbert.tokenize(tokenizer, [long, "a man"], max_length=8)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][0, 0].item() == tokenizer.cls_token_id
    assert batch["input_ids"][0, -1].item() == tokenizer.sep_token_id
    assert batch["attention_mask"][0].all() and batch["attention_mask"][1].sum() == 4


def test_load_tokenizer_from_checkpoint_dir_and_errors(tiny_bert_dir, vocab_path, tmp_path):
    from_dir = minbert.load_tokenizer(tiny_bert_dir)
    from_vocab = minbert.load_tokenizer(vocab_path)
    text = ["The capital of France is [MASK].", "a man plays the guitar"]
    assert from_dir(text)["input_ids"] == from_vocab(text)["input_ids"]
    with pytest.raises(CheckpointError, match=r"no tokenizer files \(tokenizer.json or vocab.txt\): copy a vocab.txt "
                                              r"into it, or give one with --vocab FILE"):
        minbert.load_tokenizer(tmp_path)
    assert minbert.load_tokenizer(tmp_path, vocab_fallback=vocab_path)(text)["input_ids"] == from_vocab(text)["input_ids"]


def test_pad_batch():
    ids, mask = minbert.pad_batch([[5, 6, 7], [8], [9, 10]])
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert ids.dtype == mask.dtype == torch.long
    ids, _ = minbert.pad_batch([[1], [2, 3]], pad_token_id=7)
    assert ids.tolist() == [[1, 7], [2, 3]]


def test_inputs_embeds_match_transformers_and_the_ids(hf_dir):
    """``inputs_embeds`` [b, t, D] in place of the ids' word embeddings (SMART perturbs them): on a
    padded batch, transformers.BertModel given the same inputs_embeds, unpadded and padded; the
    ids' own word embeddings give exactly the ids' output; the gradient reaches the real tokens'
    embeddings only."""
    directory, hf = hf_dir
    ours = BertModel.from_pretrained(directory).eval()
    ids, mask, types = padded_batch(seed=5)
    assert (mask == 0).any()
    g = torch.Generator().manual_seed(6)
    embeds = (torch.randn(*ids.shape, ours.config.hidden_size, generator=g) * 0.5).requires_grad_()
    with torch.no_grad():
        ref = hf(inputs_embeds=embeds, attention_mask=mask, token_type_ids=types)
        padded = ours(ids, mask, types, unpad=False, inputs_embeds=embeds)
        from_ids = ours(ids, mask, types)
        own = ours(ids, mask, types, inputs_embeds=ours.embeddings.word_embeddings(ids))
    out = ours(ids, mask, types, inputs_embeds=embeds)
    for a in (out, padded):
        assert max_diff(valid(a["last_hidden_state"], mask), valid(ref.last_hidden_state, mask)) < TOL
        assert max_diff(a["pooler_output"], ref.pooler_output) < TOL
    assert max_diff(valid(out["last_hidden_state"], mask), valid(from_ids["last_hidden_state"], mask)) > 0.1
    assert own.keys() == from_ids.keys()
    for key in from_ids:
        assert torch.equal(own[key], from_ids[key]), key
    valid(out["last_hidden_state"], mask).sum().backward()
    norms = embeds.grad.norm(dim=-1)
    assert (norms[mask.bool()] > 0).all() and (norms[~mask.bool()] == 0).all()
