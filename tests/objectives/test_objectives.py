"""Tests for bertcf/objectives.py (BSL, Contrastive Tension, TSDAE, MLM): each loss against an
independent recomputation with plain tensor math on a tiny input, BSL's EMA rule, CT's pair
labels, TSDAE's deletions, MLM's 80/10/10 split and head initialisation, and a tiny
end-to-end run of each method through ``run_pretrain.py`` (best/, last/, --resume)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import OBJECTIVE_SENTENCES as SENTENCES
from helpers import batch, load, make_objective, random_batch

from bertcf.models.encoder import SentenceEncoder
from bertcf.objectives import BSL, METHODS, TSDAE, ContrastiveTension, MaskedLM
from bertcf.objectives.base import IGNORE_INDEX, BaseObjective
from bertcf.objectives.mixture import Mixture
from bertcf.objectives.contrastive import span_mask


@torch.no_grad()
def perturb(module, scale=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.add_(scale * torch.randn(p.shape, generator=g))


def mean_pool(h, mask):
    m = mask[..., None].float()
    return (h * m).sum(1) / m.sum(1)


def regression(a, b):
    return 2 - 2 * (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


# ---- BSL --------------------------------------------------------------------------------------------

def test_bsl_loss_by_hand(tiny_bert_dir):
    enc = load(tiny_bert_dir)
    torch.manual_seed(0)
    obj = BSL(enc, momentum=0.9, predictor_hidden=16, span_p=0.5, span_cap=3, generator=torch.Generator().manual_seed(1))
    perturb(obj.target)  # the target differs from the online encoder, as after some steps
    with torch.no_grad():
        for bn in (obj.predictor[1], obj.predictor[4]):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
    ids, mask, special = batch(enc)
    state = obj.generator.get_state()
    loss, scalars = obj.loss(ids, mask, special)

    obj.generator.set_state(state)
    masked = span_mask(ids, mask, special, enc.tokenizer.mask_token_id, 0.5, 3, obj.generator)
    assert (masked != ids).any() and not (masked != ids)[special].any()
    with torch.no_grad():
        o1 = mean_pool(enc.bert(ids, mask)["last_hidden_state"], mask)
        o2 = mean_pool(enc.bert(masked, mask)["last_hidden_state"], mask)
        t1 = mean_pool(obj.target(ids, mask)["last_hidden_state"], mask)
        t2 = mean_pool(obj.target(masked, mask)["last_hidden_state"], mask)
        lin1, bn1, _, lin2, bn2, _, lin3 = obj.predictor

        def normalise(h, bn):  # BatchNorm with the batch's statistics
            return (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + bn.eps) * bn.weight + bn.bias

        def predict(x):  # (Linear - BatchNorm - ReLU) x 2 - Linear
            h = normalise(x @ lin1.weight.T + lin1.bias, bn1).clamp_min(0)
            h = normalise(h @ lin2.weight.T + lin2.bias, bn2).clamp_min(0)
            return h @ lin3.weight.T + lin3.bias

        expected = (regression(predict(o1), t2) + regression(predict(o2), t1)).mean()
    assert loss.shape == () and loss.dtype == torch.float32
    assert torch.allclose(loss, expected, atol=1e-5), (loss, expected)
    assert 0 < loss.item() < 8 and set(scalars) == {"prediction_cosine", "view_cosine"}

    loss.backward()  # stop-gradient: nothing reaches the target; the online side learns
    assert all(p.grad is None for p in obj.target.parameters())
    assert enc.bert.embeddings.word_embeddings.weight.grad is not None
    assert all(p.grad is not None for p in obj.predictor.parameters())


def test_bsl_predictor_has_the_published_shape(tiny_bert_dir):
    """BSL (Zhang et al. 2021): three linear layers D -> kD -> kD -> D, k = 8, BatchNorm and ReLU
    between them; --predictor-k and --predictor-hidden set the hidden width."""
    enc = load(tiny_bert_dir)
    d = enc.dim

    def layout(obj):
        return [(type(m).__name__, tuple(m.weight.shape) if isinstance(m, torch.nn.Linear) else None)
                for m in obj.predictor]

    def expected(h):
        return [("Linear", (h, d)), ("GatheredBatchNorm1d", None), ("ReLU", None), ("Linear", (h, h)),
                ("GatheredBatchNorm1d", None), ("ReLU", None), ("Linear", (d, h))]

    assert layout(BSL(enc)) == expected(8 * d)
    assert layout(BSL(enc, predictor_k=2)) == expected(2 * d)
    assert layout(BSL(enc, predictor_k=2, predictor_hidden=5)) == expected(5)


def test_bsl_ema_update_rule(tiny_bert_dir):
    enc = load(tiny_bert_dir)
    obj = BSL(enc, momentum=0.9)
    assert BSL(load(tiny_bert_dir)).momentum == 0.999  # the default
    target_ids = {id(p) for p in obj.target.parameters()}
    assert target_ids and not target_ids & {id(p) for p in obj.trainable_parameters()}
    assert all(not p.requires_grad for p in obj.target.parameters())
    for a, b in zip(obj.target.parameters(), enc.bert.parameters()):  # starts as a copy, not a view
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()

    perturb(enc.bert, scale=0.5, seed=1)  # as if the optimiser had moved the online encoder
    t0 = {k: v.clone() for k, v in obj.target.state_dict().items()}
    online = {k: v.clone() for k, v in enc.bert.state_dict().items()}
    obj.after_step()
    for k, v in obj.target.state_dict().items():
        assert torch.allclose(v, 0.9 * t0[k] + 0.1 * online[k], atol=1e-6), k
    obj.after_step()  # twice with a fixed online encoder: xi = m^2 xi0 + (1 - m^2) theta
    for k, v in obj.target.state_dict().items():
        assert torch.allclose(v, 0.81 * t0[k] + 0.19 * online[k], atol=1e-6), k
    assert all(torch.equal(v, online[k]) for k, v in enc.bert.state_dict().items())  # the online side untouched


# ---- Contrastive Tension ------------------------------------------------------------------------------

def test_ct_loss_by_hand(tiny_bert_dir):
    enc = load(tiny_bert_dir)
    obj = ContrastiveTension(enc, ct_negatives=2, generator=torch.Generator().manual_seed(5))
    for (k, a), b in zip(obj.second.state_dict().items(), enc.bert.state_dict().values()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), k  # identical, independent copies
    perturb(obj.second)
    ids, mask, special = batch(enc)
    state = obj.generator.get_state()
    loss, scalars = obj.loss(ids, mask, special)

    obj.generator.set_state(state)
    partner, labels = obj.pairs(len(SENTENCES))
    assert labels.tolist() == [1, 0, 0, 1, 0, 0]
    with torch.no_grad():
        a = mean_pool(enc.bert(ids, mask)["last_hidden_state"], mask)
        b = mean_pool(obj.second(ids[partner], mask[partner])["last_hidden_state"], mask[partner])
        s = (a.double() * b.double()).sum(-1)
        p = 1 / (1 + torch.exp(-s))
        expected = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p)).mean()
    assert torch.allclose(loss.double(), expected, rtol=1e-5, atol=1e-5), (loss, expected)
    assert set(scalars) == {"pos_logit", "neg_logit", "pair_accuracy"}
    loss.backward()  # both copies learn
    assert all(p.grad is not None for p in obj.second.encoder.parameters())
    assert all(p.grad is not None for p in enc.bert.encoder.parameters())


def test_ct_pair_labels(tiny_bert_dir):
    obj = ContrastiveTension(load(tiny_bert_dir), generator=torch.Generator().manual_seed(0))
    assert obj.negatives == 7
    partner, labels = obj.pairs(16)
    assert labels.nonzero().flatten().tolist() == [0, 8]  # 1 positive per 8 pairs
    assert obj.pairs(800)[1].mean() == 1 / 8
    rows = torch.arange(16)
    assert torch.equal(partner[labels.bool()], rows[labels.bool()])
    counts = torch.zeros(16, 16)
    for _ in range(1500):
        partner, labels = obj.pairs(16)
        neg = ~labels.bool()
        assert (partner[neg] != rows[neg]).all()  # a negative pairs two different sentences
        counts[rows[neg], partner[neg]] += 1
    # Each negative partner is uniform over the 15 other sentences of the batch.
    share = counts[1] / counts[1].sum()
    assert share[1] == 0 and (share[torch.arange(16) != 1] - 1 / 15).abs().max() < 0.03


# ---- TSDAE -------------------------------------------------------------------------------------------

def test_tsdae_deletion_ratio_and_special_tokens(tiny_bert_dir):
    enc = load(tiny_bert_dir)
    obj = TSDAE(enc, generator=torch.Generator().manual_seed(0))
    assert obj.deletion_ratio == 0.6
    ids, mask, special = random_batch(enc.bert.config.vocab_size, b=200, t=30)
    damaged, dmask = obj.delete(ids, mask, special)
    maskable = mask.bool() & ~special
    kept = 0
    for i in range(ids.shape[0]):
        original = ids[i][mask[i].bool()].tolist()
        out = damaged[i][dmask[i].bool()].tolist()
        assert out[0] == 2 and out[-1] == 3 and 2 not in out[1:-1] and 3 not in out[1:-1]  # [CLS]/[SEP] survive
        assert len(out) >= 3  # at least one token is kept
        it = iter(original)
        assert all(tok in it for tok in out)  # an ordered subsequence of the original
        kept += len(out) - 2
    assert (damaged[~dmask.bool()] == 0).all()
    assert abs(1 - kept / maskable.sum().item() - 0.6) < 0.03  # ~60% deleted

    obj.deletion_ratio = 0.99  # nearly everything deleted: every sentence still keeps one token
    damaged, dmask = obj.delete(ids, mask, special)
    assert (dmask.sum(1) == 3).float().mean() > 0.5 and (dmask.sum(1) >= 3).all()


# ---- MLM ---------------------------------------------------------------------------------------------

def test_mlm_80_10_10(tiny_bert_dir):
    enc = load(tiny_bert_dir)
    obj = MaskedLM(enc, generator=torch.Generator().manual_seed(0))
    assert obj.probability == 0.15 and not obj.head_from_checkpoint
    ids, mask, special = random_batch(enc.bert.config.vocab_size, b=600, t=40)
    inputs, labels = obj.mask_tokens(ids, mask, special)
    selected = labels != IGNORE_INDEX
    assert not selected[special].any()  # [CLS], [SEP] and padding are never chosen
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(inputs[~selected], ids[~selected])  # only selected tokens change
    maskable = mask.bool() & ~special
    assert abs(selected.sum() / maskable.sum() - 0.15) < 0.01
    n = selected.sum()
    to_mask = (inputs[selected] == enc.tokenizer.mask_token_id).sum() / n
    kept = (inputs[selected] == ids[selected]).sum() / n
    random = 1 - to_mask - kept
    assert abs(to_mask - 0.8) < 0.025 and abs(kept - 0.1) < 0.02 and abs(random - 0.1) < 0.02, (to_mask, kept, random)


def test_mlm_head_from_checkpoint(mlm_dir, tiny_bert_dir):
    from safetensors.torch import load_file

    enc = load(mlm_dir)
    obj = MaskedLM(enc, checkpoint=str(mlm_dir))
    assert obj.head_from_checkpoint
    saved = load_file(str(mlm_dir / "model.safetensors"))
    head = obj.head.state_dict()
    assert set(head) == {"transform.dense.weight", "transform.dense.bias", "transform.LayerNorm.weight",
                         "transform.LayerNorm.bias", "bias"}
    for k, v in head.items():
        assert torch.equal(v, saved[f"cls.predictions.{k}"]), k
    # A checkpoint without an MLM head (a plain BertModel) gives a fresh head.
    fresh = MaskedLM(load(tiny_bert_dir), checkpoint=str(tiny_bert_dir))
    assert not fresh.head_from_checkpoint
    assert torch.equal(fresh.head.bias, torch.zeros_like(fresh.head.bias))
    assert torch.equal(fresh.head.transform.LayerNorm.weight, torch.ones(enc.dim))


def test_mlm_loss_matches_transformers(mlm_dir):
    """The loss equals the cross-entropy of transformers' BertForMaskedLM (same weights, head
    included) at the selected positions, computed here by hand."""
    import transformers

    enc = load(mlm_dir)
    obj = MaskedLM(enc, checkpoint=str(mlm_dir), mlm_probability=0.3, generator=torch.Generator().manual_seed(4))
    ids, mask, special = batch(enc)
    state = obj.generator.get_state()
    loss, scalars = obj.loss(ids, mask, special)

    obj.generator.set_state(state)
    inputs, labels = obj.mask_tokens(ids, mask, special)
    hf = transformers.BertForMaskedLM.from_pretrained(str(mlm_dir)).eval()
    with torch.no_grad():
        logits = hf(input_ids=inputs, attention_mask=mask).logits
    selected = labels != IGNORE_INDEX
    logp = logits.log_softmax(-1)[selected]
    expected = -logp.gather(-1, labels[selected][:, None]).mean()
    assert torch.allclose(loss, expected, atol=1e-4), (loss, expected)
    assert set(scalars) == {"mlm_accuracy", "masked_fraction"}


# ---- the shared interface -----------------------------------------------------------------------------

@pytest.mark.parametrize("stage,method", [(stage, m) for stage, methods in METHODS.items() for m in methods
                                          if stage != "supervised"])  # tests/objectives/test_supervised.py: with labels
def test_interface(stage, method, tiny_bert_dir):
    """Every --method has one shape: the optimiser's groups hold exactly the trainable parameters
    (the encoder's unless the stage freezes it), the loss is finite, and what a checkpoint keeps
    round-trips (resume)."""
    enc = load(tiny_bert_dir, dropout=0.1)
    obj = make_objective(stage, method, enc, torch.Generator().manual_seed(0))
    assert obj.encoder is enc and (enc.flow is not None) == (stage != "mirror")
    grouped = [p for g in obj.parameter_groups() for p in g["params"]]
    assert len(grouped) == len({id(p) for p in grouped})
    assert {id(p) for p in grouped} == {id(p) for p in obj.parameters() if p.requires_grad}
    assert ({id(p) for p in enc.bert.parameters()} <= {id(p) for p in grouped}) == (stage == "mirror")
    assert obj.encoder_frozen == (stage != "mirror")
    loss, scalars = obj.loss(*batch(enc))
    assert torch.isfinite(loss) and all(torch.isfinite(torch.as_tensor(v)) for v in scalars.values())
    other = make_objective(stage, method, load(tiny_bert_dir, dropout=0.1))
    for name, module in obj.checkpoint_modules().items():
        other.checkpoint_modules()[name].load_state_dict(module.state_dict())
        for (k, a), b in zip(module.state_dict().items(), other.checkpoint_modules()[name].state_dict().values()):
            assert torch.equal(a, b), k



def test_a_mixture_has_the_shape_of_an_objective(tiny_bert_dir):
    """A mixture and its parts share one base (``BaseObjective``): the same device and frozen
    state of the one encoder, groups that hold each trainable parameter once."""
    enc = load(tiny_bert_dir)
    parts = {"a": make_objective("mirror", "simcse", enc), "b": make_objective("mirror", "ct", enc)}
    mixture = Mixture(parts)
    assert isinstance(mixture, BaseObjective) and all(isinstance(p, BaseObjective) for p in parts.values())
    assert mixture.device == enc.device == parts["a"].device and not mixture.encoder_frozen
    grouped = [p for g in mixture.parameter_groups() for p in g["params"]]
    assert len(grouped) == len({id(p) for p in grouped}) == len([p for p in mixture.parameters() if p.requires_grad])
    enc.bert.requires_grad_(False)
    assert mixture.encoder_frozen and parts["b"].encoder_frozen


# ---- end to end through run_pretrain's main --------------------------------------------------------

def pretrain(model, data_dir, out_dir, method, *extra):
    from bertcf.commands.pretrain import run as main

    return main(["--stage", "mirror", "--method", method, "--model", str(model), "--data-dir", str(data_dir),
                 "--corpus-from-tasks", "--out-dir", str(out_dir), "--batch-size", "8", "--max-length", "24",
                 "--eval-every", "2", "--log-every", "1", "--device", "cpu", "--seed", "3", *extra])


def objective_state(run_dir):
    state = torch.load(run_dir / "last" / "training_state.pt", map_location="cpu", weights_only=False)
    return state["modules"]["objective"]


EXTRA_MODULES = {"bsl": ("predictor.", "target."), "ct": ("second.",), "tsdae": ("decoder.",), "mlm": ("head.",)}


@pytest.mark.parametrize("method", sorted(EXTRA_MODULES))
def test_end_to_end(method, tiny_bert_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    summary = pretrain(tiny_bert_dir, tiny_data_dir, out, method, "--steps", "3")
    assert summary["step"] == 3 and math.isfinite(summary["best"])
    assert json.loads((out / "config.json").read_text())["method"] == method
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 2, 3]
    for kept in ("best", "last"):
        assert (out / kept / "model.safetensors").is_file()
        encoder = SentenceEncoder.from_pretrained(out / kept)
        assert encoder.encode(["A man plays a guitar."]).shape == (1, 32)
    state = objective_state(out)
    assert any(k.startswith("encoder.bert.") for k in state)
    for prefix in EXTRA_MODULES[method]:
        assert any(k.startswith(prefix) for k in state), prefix
    # last/ holds the trained encoder (the online / first copy), which moved from the start
    last = load(out / "last")
    start = load(tiny_bert_dir)
    assert not torch.equal(last.bert.encoder.layer[0].output.dense.weight, start.bert.encoder.layer[0].output.dense.weight)
    assert torch.equal(last.bert.encoder.layer[0].output.dense.weight, state["encoder.bert.encoder.layer.0.output.dense.weight"])


@pytest.mark.parametrize("method", sorted(EXTRA_MODULES))
def test_resume_is_exact(method, tiny_bert_dir, tiny_data_dir, tmp_path):
    """2 steps + --resume for 2 more == 4 steps in one go (views, pairs, deletions, masks, EMA)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    pretrain(tiny_bert_dir, tiny_data_dir, straight, method, "--steps", "4")
    pretrain(tiny_bert_dir, tiny_data_dir, resumed, method, "--steps", "2")
    pretrain(tiny_bert_dir, tiny_data_dir, resumed, method, "--steps", "4", "--resume")
    a, b = objective_state(straight), objective_state(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_bad_objective_flags(tiny_bert_dir, tiny_data_dir, tmp_path, capsys):
    from bertcf.errors import UsageError

    for flag, value in [("--momentum", "1.0"), ("--ct-negatives", "0"), ("--deletion-ratio", "1"),
                        ("--mlm-probability", "0")]:
        with pytest.raises(SystemExit) as e:  # argparse's error(): one line, exit status 2
            pretrain(tiny_bert_dir, tiny_data_dir, tmp_path / "bad", "bsl", "--steps", "1", flag, value)
        assert e.value.code == 2
        assert f"argument {flag}: must be " in capsys.readouterr().err
    with pytest.raises(UsageError, match="not a method of --stage joint"):
        from bertcf.commands.pretrain import run as main
        main(["--stage", "joint", "--method", "bsl", "--model", str(tiny_bert_dir), "--data-dir", str(tiny_data_dir),
              "--corpus-from-tasks", "--out-dir", str(tmp_path / "bad"), "--device", "cpu"])


# ---- pretraining from random weights (a config-only directory) ------------------------------------

def config_only_dir(directory, vocab_path, **config):
    """A directory with a BERT config.json and a vocab.txt, and no weights."""
    import shutil

    from helpers import TINY_BERT_CONFIG

    directory.mkdir(parents=True)
    vocab_size = sum(1 for line in Path(vocab_path).read_text(encoding="utf-8").splitlines() if line)
    settings = {**TINY_BERT_CONFIG, "vocab_size": vocab_size, "initializer_range": 0.02, **config}
    (directory / "config.json").write_text(json.dumps(settings))
    shutil.copy(vocab_path, directory / "vocab.txt")
    return directory


def test_config_only_directory_trains_mlm_from_random_weights(vocab_path, tiny_data_dir, tmp_path, capsys):
    """A config-only --model starts from random weights (one note says so), trains by MLM from a
    fresh head, logs the held-out masked-token accuracy, and writes a best/ that loads."""
    config_dir = config_only_dir(tmp_path / "bert-config", vocab_path)
    out = tmp_path / "run"
    pretrain(config_dir, tiny_data_dir, out, "mlm", "--steps", "4", "--lr", "1e-3")
    captured = capsys.readouterr().out
    assert "holds a config.json and no weights: starting from random weights" in captured
    assert "prediction head freshly initialised" in captured
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= m["mlm_heldout_accuracy"] <= 1 and m["mlm_heldout_loss"] > 0 for m in metrics)
    encoder = SentenceEncoder.from_pretrained(out / "best")
    assert torch.isfinite(encoder.encode(["A man plays a guitar."])).all()


def test_mlm_from_random_weights_can_select_on_heldout_accuracy(vocab_path, tiny_data_dir, tmp_path, capsys):
    """--select-on mlm-heldout: best/ is the evaluation with the highest held-out masked-token
    accuracy (0 at the random step 0), not the highest STS dev Spearman, which MLM from random
    weights first lowers; STS is still evaluated and logged."""
    config_dir = config_only_dir(tmp_path / "bert-config", vocab_path)
    out = tmp_path / "run"
    summary = pretrain(config_dir, tiny_data_dir, out, "mlm", "--steps", "6", "--lr", "3e-3",
                       "--select-on", "mlm-heldout")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    accuracy = [m["mlm_heldout_accuracy"] for m in metrics]
    assert all("sts_spearman" in m for m in metrics)
    assert accuracy[0] == 0 and max(accuracy) > 0, accuracy  # the test needs training to move it
    assert summary["best"] == max(accuracy) and summary["best_step"] == metrics[accuracy.index(max(accuracy))]["step"]
    assert summary["best_step"] > 0
    assert "held-out masked-token accuracy: step 0 0.0000" in capsys.readouterr().out
    assert SentenceEncoder.from_pretrained(out / "best") is not None


def test_mlm_loss_of_a_random_model_starts_near_uniform(real_vocab_path, tmp_path):
    """With BERT's initialisation (std 0.02) the logits are near 0 (std 0.16 here), so the loss at
    step 0 is near the uniform baseline ln V (V = 30522: 10.33): the logits' spread adds
    sigma^2 / 2 = 0.013, and this random network scores the true token 0.05 below the average
    logit; a wrong initialisation or an untied, unscaled head is far off."""
    from minbert import load_tokenizer

    torch.manual_seed(0)
    enc = SentenceEncoder.from_pretrained(config_only_dir(tmp_path / "cfg", real_vocab_path, hidden_size=64,
                                                         intermediate_size=256))
    assert enc.tokenizer.vocab_size == 30522 and load_tokenizer(tmp_path / "cfg").vocab_size == 30522
    obj = MaskedLM(enc, mlm_probability=0.15, generator=torch.Generator().manual_seed(0))
    assert not obj.head_from_checkpoint
    many = batch(enc, SENTENCES * 30)  # enough masked tokens for a tight mean
    with torch.no_grad():
        loss, _ = obj.loss(*many)
    assert abs(loss.item() - math.log(30522)) < 0.1, loss.item()
    heldout = obj.heldout_metrics(*many)
    assert heldout["mlm_heldout_loss"] == pytest.approx(math.log(30522), abs=0.1)
    assert obj.heldout_metrics(*many) == heldout  # the same masks every time
