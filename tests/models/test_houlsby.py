"""Houlsby adapters on minBERT (bertcf/models/bottleneck.py, --peft houlsby) against the paper's
equation computed by hand on the same weights: h + W_up f(W_down h + b_down) + b_up after each
attention and feed-forward output projection (after its dropout, before the residual add and the
LayerNorm), f exact GELU; the adapted encoder equal to the base at initialisation (W_up = 0); the
gradients on the adapters and the LayerNorms alone; per task, a task's rows through the shared adapter
and its own; the checkpoint (the base unchanged, the adapters and the LayerNorms beside it) read back
unmerged; merging and the ONNX export refused; the settings' refusals."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file

from minbert import BertModel, CheckpointError

from bertcf.errors import UsageError
from bertcf.models import peft as adapters
from bertcf.models.bottleneck import DEFAULT, HOULSBY_CONFIG, HOULSBY_WEIGHTS, Adapted, HoulsbyAdapters
from bertcf.models.encoder import SentenceEncoder
from bertcf.models.peft import SHARED, PeftSettings, make_adapters
from bertcf.multitask import MultitaskModel
from bertcf.multitask.tasks import builtin_tasks
from bertcf.training.optim import make_optimizer
from helpers import padded_ids

pytestmark = pytest.mark.usefixtures("one_thread")
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
HOULSBY = PeftSettings(peft="houlsby", peft_bottleneck=4)
TASKS = ["sst", "qqp", "sts"]


def randomized(bert: nn.Module, seed=1) -> None:
    """Every adapter tensor and LayerNorm random (W_up, the biases and the LayerNorms start at 0 and
    1, which would hide a wrong formula)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in bert.named_parameters():
            if p.requires_grad:
                p.copy_((1 if "LayerNorm.weight" in name else 0) + 0.3 * torch.randn(p.shape, generator=g,
                                                                                     dtype=p.dtype))


def adapted_bert(bert_dir, tasks=(), dtype=torch.float64):
    plain = BertModel.from_pretrained(bert_dir, **NO_DROPOUT).to(dtype).eval()
    bert = copy.deepcopy(plain)
    return plain, bert, make_adapters(bert, HOULSBY, tasks)


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def layer_norm(z, ln):
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    return (z - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def by_hand(sublayer, h, residual, names):
    """A sublayer output with its adapters, the paper's equation written out: LayerNorm(y + sum over
    the adapters of (W_up f(W_down y + b_down) + b_up) + residual), y = W h + b."""
    y = h @ sublayer.dense.weight.T + sublayer.dense.bias
    adapted = y
    for name in names:
        a = sublayer.dropout.adapters[name]
        adapted = adapted + gelu(y @ a.down.weight.T + a.down.bias) @ a.up.weight.T + a.up.bias
    return layer_norm(adapted + residual, sublayer.LayerNorm)


def encoder_by_hand(bert, ids, names):
    """The adapted encoder's last hidden state from the hand-written sublayer outputs (the frozen
    attention, feed-forward and embeddings as minBERT computes them; no padding)."""
    x = bert.embeddings(ids, torch.zeros_like(ids))
    for layer in bert.encoder.layer:
        x = by_hand(layer.attention.output, layer.attention.self(x, None), x, names)
        x = by_hand(layer.output, layer.intermediate(x), x, names)
    return x


def test_the_adapted_encoder_is_the_papers_equation(tiny_bert_dir):
    """Two adapters a layer, each after its projection (W_up set by hand, nonzero), equal to the
    equation by hand at every layer; they change the output."""
    plain, bert, houlsby = adapted_bert(tiny_bert_dir)
    assert houlsby.modules() == 2 * bert.config.num_hidden_layers
    assert all(isinstance(out.dropout, Adapted) for layer in bert.encoder.layer
               for out in (layer.attention.output, layer.output))
    randomized(bert)
    ids, _ = padded_ids(lengths=(7, 7))
    y = bert(ids)["last_hidden_state"]
    torch.testing.assert_close(y, encoder_by_hand(bert, ids, [DEFAULT]), atol=1e-12, rtol=1e-12)
    assert (y - plain(ids)["last_hidden_state"]).abs().max() > 1e-2
    a = bert.encoder.layer[0].output.dropout.adapters[DEFAULT]
    assert a.down.weight.shape == (4, bert.config.hidden_size) and a.up.weight.shape == (bert.config.hidden_size, 4)


def test_at_initialisation_the_adapted_encoder_is_the_base_exactly(tiny_bert_dir):
    """W_up and b_up zero: the outputs equal the base's bit for bit, in eval mode and in training
    mode with its dropout (the adapters draw nothing); W_down small, drawn as adapter-bert draws it."""
    plain = BertModel.from_pretrained(tiny_bert_dir).eval()
    bert = copy.deepcopy(plain)
    make_adapters(bert, HOULSBY)
    ids, mask = padded_ids()
    for train in (False, True):
        plain.train(train), bert.train(train)
        torch.manual_seed(3)
        want = plain(ids, mask)
        torch.manual_seed(3)
        got = bert(ids, mask)
        assert torch.equal(got["last_hidden_state"], want["last_hidden_state"])
        assert torch.equal(got["pooler_output"], want["pooler_output"])
    for m in bert.modules():
        if isinstance(m, Adapted):
            a = m.adapters[DEFAULT]
            assert not a.up.weight.any() and not a.up.bias.any() and not a.down.bias.any()
            assert 0 < a.down.weight.abs().max() <= 2e-3


def test_gradients_reach_the_adapters_and_the_layernorms_only(tiny_bert_dir):
    """The base frozen (no gradient, unchanged by a step), the adapters and every LayerNorm (the
    embeddings' and each layer's) trained; at step 0 W_down's gradient is zero (it flows through W_up = 0)."""
    plain, bert, houlsby = adapted_bert(tiny_bert_dir, dtype=torch.float32)
    trained = {n for n, p in bert.named_parameters() if p.requires_grad}
    layer_norms = {n for n, _ in bert.named_parameters() if ".LayerNorm." in n}
    own = {id(p) for p in houlsby.parameters_of(DEFAULT)}
    assert trained == layer_norms | {n for n, p in bert.named_parameters() if id(p) in own}
    assert len(layer_norms) == 2 * (1 + 2 * bert.config.num_hidden_layers)
    assert set(houlsby.state_dict()) == trained
    ids, mask = padded_ids()
    optimizer = make_optimizer(bert.parameters(), 1e-2, 0.01, "cpu")
    bert(ids, mask)["last_hidden_state"].square().mean().backward()
    grads = dict(bert.named_parameters())
    assert all(grads[n].grad is None for n in grads if n not in trained)
    assert all(grads[n].grad.abs().max() > 0 for n in trained if ".down." not in n)
    assert all(not grads[n].grad.any() for n in trained if ".down." in n)
    optimizer.step()
    optimizer.zero_grad()
    base = plain.state_dict()
    assert all(torch.equal(v, base[k].float()) for k, v in bert.state_dict().items() if k in base and
               k not in trained)
    bert(ids, mask)["last_hidden_state"].square().mean().backward()  # W_up moved: W_down has a gradient now
    assert all(grads[n].grad.abs().max() > 0 for n in trained if ".down.weight" in n)


def test_a_task_passes_through_the_shared_adapter_and_its_own(tiny_bert_dir):
    """Per task: the shared adapter's and the task's branches added at each place, by hand; ``shared``
    alone outside the task; a one-task step's gradients on the shared adapter and its own only."""
    _, bert, houlsby = adapted_bert(tiny_bert_dir, TASKS)
    assert houlsby.tasks == tuple(TASKS) and houlsby.names == (SHARED, *TASKS)
    randomized(bert)
    ids, _ = padded_ids(seed=2, lengths=(6, 6))
    with houlsby.of_task("qqp"):
        y = bert(ids)["last_hidden_state"]
    torch.testing.assert_close(y, encoder_by_hand(bert, ids, [SHARED, "qqp"]), atol=1e-12, rtol=1e-12)
    assert (y - encoder_by_hand(bert, ids, [SHARED, "sst"])).abs().max() > 1e-3
    torch.testing.assert_close(bert(ids)["last_hidden_state"], encoder_by_hand(bert, ids, [SHARED]),
                               atol=1e-12, rtol=1e-12)

    torch.manual_seed(0)
    model = MultitaskModel(SentenceEncoder.from_pretrained(tiny_bert_dir, **NO_DROPOUT),
                           list(builtin_tasks().values()), proj_dim=8).eval()
    model.encoder.adapters = make_adapters(model.encoder.bert, HOULSBY, TASKS)
    randomized(model.encoder.bert)
    ids, mask = padded_ids(seed=3, lengths=(5, 8, 3, 6, 4, 7))  # three QQP pairs
    model(ids, mask, {"qqp": 3})["qqp"][0].sum().backward()
    grads = {name: torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                              for p in model.encoder.adapters.parameters_of(name)]) for name in [SHARED, *TASKS]}
    assert grads[SHARED].abs().max() > 0 and grads["qqp"].abs().max() > 0
    assert not grads["sst"].any() and not grads["sts"].any()


def test_the_checkpoint_holds_the_base_unchanged_and_reads_back_unmerged(tiny_bert_dir, tmp_path):
    """model.safetensors: the base as loaded, LayerNorms too; the adapters and the trained LayerNorms in
    their own file with a small config; from_pretrained reads them back unmerged, the same vectors
    bit for bit. A save of another method there removes them; load_merged refuses them."""
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, **NO_DROPOUT).eval()
    encoder.adapters = make_adapters(encoder.bert, HOULSBY)
    randomized(encoder.bert)
    sentences = ["a man plays the guitar .", "the dog runs on the beach", "two women talk"]
    vectors = torch.as_tensor(encoder.encode(sentences))
    encoder.save_pretrained(tmp_path / "h")

    saved, base = load_file(str(tmp_path / "h" / "model.safetensors")), load_file(str(tiny_bert_dir /
                                                                                       "model.safetensors"))
    assert saved.keys() <= base.keys() and all(torch.equal(v, base[k]) for k, v in saved.items())
    own = load_file(str(tmp_path / "h" / HOULSBY_WEIGHTS))
    assert own.keys() == encoder.adapters.state_dict().keys()
    assert not torch.equal(own["embeddings.LayerNorm.weight"], base["embeddings.LayerNorm.weight"])
    assert not adapters.has_adapter(tmp_path / "h") and not adapters.has_task_adapters(tmp_path / "h")

    loaded = SentenceEncoder.from_pretrained(tmp_path / "h").eval()
    assert isinstance(loaded.adapters, HoulsbyAdapters) and loaded.adapters.size == 4
    assert all(p.requires_grad for p in loaded.parameters())  # as a plain checkpoint loads: --peft is refused on it
    assert torch.equal(torch.as_tensor(loaded.encode(sentences)), vectors)
    with pytest.raises(CheckpointError, match="do not merge"):
        adapters.load_merged(tmp_path / "h", BertModel.from_pretrained(tmp_path / "h"))
    with pytest.raises(UsageError, match="already carries Houlsby adapters"):
        make_adapters(loaded.bert, HOULSBY)
    with pytest.raises(UsageError, match="carries Houlsby adapters"):
        make_adapters(loaded.bert, PeftSettings(peft="lora"))

    pytest.importorskip("peft")
    lora = SentenceEncoder.from_pretrained(tiny_bert_dir)
    lora.adapters = make_adapters(lora.bert, PeftSettings(peft="lora", peft_rank=2))
    lora.save_pretrained(tmp_path / "h")
    assert adapters.has_adapter(tmp_path / "h") and not (tmp_path / "h" / HOULSBY_CONFIG).exists()
    loaded.save_pretrained(tmp_path / "h")
    assert not adapters.has_adapter(tmp_path / "h") and (tmp_path / "h" / HOULSBY_WEIGHTS).exists()


def test_a_per_task_checkpoint_reads_back_with_its_tasks_only(tiny_bert_dir, tmp_path):
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir, **NO_DROPOUT).eval()
    encoder.adapters = make_adapters(encoder.bert, HOULSBY, TASKS)
    randomized(encoder.bert)
    encoder.save_pretrained(tmp_path)
    assert adapters.has_task_adapters(tmp_path)
    with pytest.raises(CheckpointError, match="one adapter per task"):
        SentenceEncoder.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="no adapter for the tasks para"):
        SentenceEncoder.from_pretrained(tmp_path, task_adapters=["sst", "para"])
    loaded = SentenceEncoder.from_pretrained(tmp_path, task_adapters=TASKS).eval()
    ids, mask = padded_ids(seed=5)
    for task in TASKS:
        with encoder.adapters.of_task(task), loaded.adapters.of_task(task):
            assert torch.equal(loaded(ids, mask), encoder(ids, mask))


def test_the_onnx_export_refuses_an_unmerged_houlsby_checkpoint(tiny_bert_dir, tmp_path):
    from bertcf.backend.onnx_export import export_onnx

    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    encoder.adapters = make_adapters(encoder.bert, HOULSBY)
    encoder.save_pretrained(tmp_path / "h")
    with pytest.raises(UsageError, match=r"Houlsby adapters .*do not merge.*--backend torch"):
        export_onnx(tmp_path / "h")
    assert not (tmp_path / "h" / "onnx").exists()


@pytest.mark.parametrize("settings, needle", [
    (dict(peft="houlsby", merge=True), "--merge does not apply to --peft houlsby: its bottleneck adapters have a "
                                       "nonlinearity"),
    (dict(peft="houlsby", peft_rank=4), "--peft-rank does not apply to --peft houlsby"),
    (dict(peft="houlsby", peft_targets=("query",)), "--peft-targets does not apply to --peft houlsby"),
    (dict(peft="houlsby", peft_dropout=0.1), "--peft-dropout does not apply to --peft houlsby"),
    (dict(peft="lora", peft_bottleneck=8), "--peft-bottleneck does not apply to --peft lora"),
    (dict(peft="ia3", peft_bottleneck=8), "--peft-bottleneck does not apply to --peft ia3"),
    (dict(peft_bottleneck=8), "--peft-bottleneck does not apply without --peft"),
    (dict(peft="houlsby", peft_bottleneck=0), "peft_bottleneck must be at least 1"),
])
def test_settings_that_do_not_apply_are_refused(settings, needle):
    with pytest.raises(UsageError, match=needle):
        PeftSettings(**settings)


def test_on_real_weights_the_start_is_the_base_and_the_count_is_the_papers(real_bert_dir):
    """all-MiniLM-L6-v2 ($BERTCF_REAL_BERT): at initialisation the adapted encoder's vectors are the
    base's bit for bit; the trained parameters are 2L (2 m D + m + D) for the adapters and the
    LayerNorms' 2 D (1 + 2L), as the paper counts them."""
    plain = SentenceEncoder.from_pretrained(real_bert_dir).eval()
    adapted = SentenceEncoder.from_pretrained(real_bert_dir).eval()
    adapted.adapters = make_adapters(adapted.bert, PeftSettings(peft="houlsby", peft_bottleneck=16))
    sentences = ["A man is playing a guitar.", "The cat sleeps on the warm windowsill all afternoon."]
    assert torch.equal(torch.as_tensor(adapted.encode(sentences)), torch.as_tensor(plain.encode(sentences)))
    layers, width, m = adapted.bert.config.num_hidden_layers, adapted.dim, 16
    trained = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert trained == 2 * layers * (2 * m * width + m + width) + 2 * width * (1 + 2 * layers)
