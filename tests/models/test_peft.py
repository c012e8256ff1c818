"""peft's LoRA, DoRA and IA3 on minBERT (bertcf/models/peft.py) against their references: the
papers' equations computed by hand on the same weights (outputs and gradients), and transformers'
BertModel wrapped by peft with the same adapter weights; the checkpoint (base beside the adapter as
peft saves it) and its merged form; the refusals of targets."""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn
from torch.func import functional_call

peft = pytest.importorskip("peft", reason="peft is an optional extra: pip install -e '.[peft]'")
transformers = pytest.importorskip("transformers")

from minbert import BertModel  # noqa: E402

from bertcf.errors import UsageError  # noqa: E402
from bertcf.models import peft as adapters  # noqa: E402
from bertcf.models.encoder import SentenceEncoder  # noqa: E402
from bertcf.models.peft import Adapters, PeftSettings, adamw_state_bytes, check_targets  # noqa: E402
from bertcf.training.optim import make_optimizer  # noqa: E402
from helpers import padded_ids  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
SETTINGS = {"lora": PeftSettings(peft="lora", peft_rank=4, peft_alpha=12.0),
            "dora": PeftSettings(peft="dora", peft_rank=4, peft_alpha=12.0),
            "ia3": PeftSettings(peft="ia3")}


def randomized(adapted: nn.Module, seed=1) -> dict:
    """Every adapter parameter of ``adapted`` random (LoRA's B and IA3's vectors start at 0 and 1,
    which would hide a wrong formula): name -> parameter."""
    g = torch.Generator().manual_seed(seed)
    trained = {n: p for n, p in adapted.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for name, p in trained.items():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.copy_(1 + 0.1 * noise if ("ia3" in name or "magnitude" in name) else 0.1 * noise)
    return trained


def adapted_bert(bert_dir, method):
    """A plain minBERT, a copy adapted by ``method`` (its Adapters) and the adapter's random tensors."""
    plain = BertModel.from_pretrained(bert_dir, **NO_DROPOUT).double().eval()  # float64: exact comparisons
    adapted = Adapters(copy.deepcopy(plain), SETTINGS[method])
    return plain, adapted, randomized(adapted.bert.eval())


def hand_weights(method, plain, trained, settings) -> dict:
    """The papers' adapted weights, from ``plain``'s weights and the adapter tensors of ``trained``
    (keys as named in the adapted model): {'<module>.weight' / '.bias': tensor} for functional_call."""
    out, modules = {}, dict(plain.named_modules())
    scale = settings.peft_alpha / settings.peft_rank
    for name in {re.split(r"\.(lora_|ia3_l)", k)[0] for k in trained}:
        W, b = modules[name].weight, modules[name].bias
        if method == "ia3":  # Liu et al. 2022: l * (W x + b); a feed-forward layer: W (l * x) + b
            l = trained[f"{name}.ia3_l.default"]  # [out, 1] or [1, in]
            out[f"{name}.weight"] = W * l
            if l.shape[0] != 1:
                out[f"{name}.bias"] = b * l.squeeze(1)
            continue
        A, B = trained[f"{name}.lora_A.default.weight"], trained[f"{name}.lora_B.default.weight"]
        merged = W + scale * B @ A  # Hu et al. 2021: W x + (alpha / r) B A x
        if method == "dora":  # Liu et al. 2024: m (W + s B A) / ||W + s B A||_c, the norm a constant in backward
            m = trained[f"{name}.lora_magnitude_vector.default.weight"]
            merged = (m / merged.norm(dim=1).detach())[:, None] * merged
        out[f"{name}.weight"] = merged
    return out


@pytest.mark.parametrize("method", ["lora", "dora", "ia3"])
def test_outputs_and_gradients_equal_the_papers_equations(tiny_bert_dir, method):
    """The adapted minBERT (through peft) against a plain minBERT whose weights are the paper's
    adapted weights computed by hand from the same adapter tensors: the outputs, and the gradients
    of a loss with respect to every adapter tensor."""
    plain, adapted, trained = adapted_bert(tiny_bert_dir, method)
    adapted = adapted.bert
    ids, mask = padded_ids()
    probe = torch.randn(*ids.shape, plain.config.hidden_size, generator=torch.Generator().manual_seed(2),
                        dtype=torch.float64)

    y = adapted(ids, mask)["last_hidden_state"]
    (y * probe).sum().backward()
    leaves = {k: p.detach().clone().requires_grad_(True) for k, p in trained.items()}
    y_hand = functional_call(plain, hand_weights(method, plain, leaves, SETTINGS[method]), (ids, mask))
    y_hand = y_hand["last_hidden_state"]
    (y_hand * probe).sum().backward()

    assert (y - plain(ids, mask)["last_hidden_state"]).abs().max() > 1e-2  # the adapters do change the output
    torch.testing.assert_close(y, y_hand, atol=1e-10, rtol=1e-10)
    for name, p in trained.items():
        torch.testing.assert_close(p.grad, leaves[name].grad, atol=1e-9, rtol=1e-9, msg=name)


@pytest.mark.parametrize("method", ["lora", "dora", "ia3"])
def test_equals_transformers_bert_wrapped_by_peft(tiny_bert_dir, method):
    """The same adapter on transformers' BertModel (peft's own use): minBERT's module names are
    BERT's, so peft's state dict of one loads into the other, and the outputs and the adapters'
    gradients agree."""
    _, adapted, trained = adapted_bert(tiny_bert_dir, method)
    ours = peft.get_peft_model_state_dict(adapted.model)
    hf = transformers.BertModel.from_pretrained(str(tiny_bert_dir), attn_implementation="eager", **NO_DROPOUT)
    hf = peft.get_peft_model(hf.double(), SETTINGS[method].peft_config()).eval()
    result = peft.set_peft_model_state_dict(hf, ours)
    assert not [k for k in result.missing_keys if any(t in k for t in ("lora_", "ia3_"))]
    assert not result.unexpected_keys
    ids, mask = padded_ids(seed=3)
    y_ours = adapted.bert(ids, mask)["last_hidden_state"]
    y_hf = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(y_ours[real], y_hf[real], atol=1e-10, rtol=1e-10)
    y_ours[real].square().sum().backward()
    y_hf[real].square().sum().backward()
    theirs = {n.removeprefix("base_model.model."): p for n, p in hf.named_parameters() if p.requires_grad}
    assert theirs.keys() == trained.keys()
    for name, p in trained.items():
        torch.testing.assert_close(p.grad, theirs[name].grad, atol=1e-9, rtol=1e-9, msg=name)


@pytest.mark.parametrize("method", ["lora", "dora", "ia3"])
def test_checkpoint_holds_the_base_and_peft_adapter_and_loads_merged(tiny_bert_dir, tmp_path, method):
    """save_pretrained writes the base weights unchanged (minBERT's names) and the adapter as peft
    saves it; from_pretrained reads it back merged (plain Linear layers) with the unmerged model's
    vectors; that merged encoder saved again is a plain checkpoint (no adapter) which transformers'
    BertModel loads with nothing missing, and peft loads the adapter onto transformers' BertModel."""
    from safetensors.torch import load_file

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, **NO_DROPOUT).eval()
    encoder.adapters = Adapters(encoder.bert, SETTINGS[method])
    randomized(encoder.bert)
    sentences = ["a man plays the guitar .", "the dog runs on the beach", "two women talk"]
    unmerged = torch.as_tensor(encoder.encode(sentences))
    encoder.save_pretrained(tmp_path / "adapted")

    saved = load_file(str(tmp_path / "adapted" / "model.safetensors"))
    base = load_file(str(tiny_bert_dir / "model.safetensors"))
    assert saved.keys() == {k for k in base if not k.endswith("position_ids")} | {"pooler.dense.weight",
                                                                                  "pooler.dense.bias"} & saved.keys()
    for k in saved:
        assert torch.equal(saved[k], base[k]), k
    assert {p.name for p in (tmp_path / "adapted").iterdir()} >= {adapters.ADAPTER_CONFIG, adapters.ADAPTER_WEIGHTS}
    assert not (tmp_path / "adapted" / "README.md").exists()  # peft's model card left out

    merged = SentenceEncoder.from_pretrained(tmp_path / "adapted").eval()
    assert all(type(m) is nn.Linear for n, m in merged.bert.named_modules() if n.endswith(("query", "dense")))
    torch.testing.assert_close(torch.as_tensor(merged.encode(sentences)), unmerged, atol=1e-5, rtol=1e-5)

    merged.save_pretrained(tmp_path / "merged")
    assert not adapters.has_adapter(tmp_path / "merged")
    hf, info = transformers.BertModel.from_pretrained(str(tmp_path / "merged"), output_loading_info=True)
    assert not info["missing_keys"]
    hf_adapted = peft.PeftModel.from_pretrained(
        transformers.BertModel.from_pretrained(str(tiny_bert_dir), **NO_DROPOUT), str(tmp_path / "adapted"))
    # transformers' own loading finds the adapter beside the base (its peft integration) and applies it;
    # transformers 5.24 misnames DoRA's magnitudes and leaves them at their initial values: merged/ serves it
    hf_found = [transformers.BertModel.from_pretrained(str(tmp_path / "adapted"), **NO_DROPOUT)] * (method != "dora")
    ids, mask = padded_ids(seed=4)
    real = mask.bool()
    ours = merged.bert(ids, mask)["last_hidden_state"][real]
    with torch.no_grad():
        torch.testing.assert_close(hf.eval()(input_ids=ids, attention_mask=mask).last_hidden_state[real], ours,
                                   atol=1e-5, rtol=1e-5)
        for model in [hf_adapted, *hf_found]:
            torch.testing.assert_close(model.eval()(input_ids=ids, attention_mask=mask).last_hidden_state[real],
                                       ours, atol=1e-5, rtol=1e-5)


def test_default_targets_adapt_every_linear_layer_of_the_layers_but_the_pooler(tiny_bert_dir):
    bert = BertModel.from_pretrained(tiny_bert_dir)
    Adapters(bert, PeftSettings(peft="lora"))
    wrapped = sorted(n for n, m in bert.named_modules() if hasattr(m, "lora_A"))
    layers = bert.config.num_hidden_layers
    assert len(wrapped) == 6 * layers and not any(n.startswith("pooler") for n in wrapped)
    assert {n for n, p in bert.named_parameters() if p.requires_grad} == {
        n for n, _ in bert.named_parameters() if ".lora_" in n}  # the base frozen
    ia3 = BertModel.from_pretrained(tiny_bert_dir)
    Adapters(ia3, PeftSettings(peft="ia3"))
    assert len([n for n, m in ia3.named_modules() if hasattr(m, "ia3_l")]) == 4 * layers


@pytest.mark.parametrize("target, needle", [("nothing", "matches no module"), ("LayerNorm", "not a Linear layer"),
                                            ("word_embeddings", "not a Linear layer")])
def test_a_target_that_matches_no_linear_layer_is_refused(tiny_bert_dir, target, needle):
    bert = BertModel.from_pretrained(tiny_bert_dir)
    with pytest.raises(UsageError, match=needle):
        check_targets(bert, ("query", target))
    with pytest.raises(UsageError, match=needle):
        Adapters(bert, PeftSettings(peft="lora", peft_targets=(target,)))


@pytest.mark.parametrize("settings, needle", [
    (dict(peft_rank=4), "--peft-rank does not apply without --peft"),
    (dict(merge=True), "--merge does not apply without --peft"),
    (dict(peft="ia3", peft_alpha=4.0), "--peft-alpha does not apply to --peft ia3"),
    (dict(peft="lora", peft_feedforward=("output.dense",)), "--peft-feedforward does not apply to --peft lora"),
    (dict(peft="ia3", peft_feedforward=("query",)), "not among the targets"),
    (dict(peft="lora", peft_rank=0), "peft_rank must be at least 1"),
])
def test_settings_that_do_not_apply_are_refused(settings, needle):
    with pytest.raises(UsageError, match=needle):
        PeftSettings(**settings)


def test_adamw_state_size_is_what_adamw_keeps(tiny_bert_dir):
    """The optimiser state the runs report (two moments and a step per trained tensor) is what
    the project's fused AdamW holds after a step."""
    bert = BertModel.from_pretrained(tiny_bert_dir)
    Adapters(bert, PeftSettings(peft="dora"))
    optimizer = make_optimizer(bert.parameters(), 1e-3, 0.01, "cpu")
    ids, mask = padded_ids()
    bert(ids, mask)["last_hidden_state"].square().mean().backward()
    optimizer.step()
    held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
               if torch.is_tensor(t))
    trained = [p for p in bert.parameters() if p.requires_grad]
    assert held == adamw_state_bytes(trained) > 0
    assert len(optimizer.state) == len(trained)
