"""bertcf.SentenceEncoder: encode (shapes, order, pooling, normalisation, modes), checkpoints with
and without a flow head, run directories, and the real-checkpoint acceptance check."""
from __future__ import annotations

import contextlib
import json
import shutil

import pytest
import torch
import transformers

from bertcf import SentenceEncoder
from bertcf.models.encoder import FLOW_FILE
from bertcf.models.flow import Glow
from bertcf.runs import resolve_encoder_path
from minbert import CheckpointError, tokenize

TOL = 1e-5

# Very different lengths, so sorting by length and batching both matter.
SENTENCES = [
    "a man is playing a guitar.",
    "hi",
    "the old company talks about the election in the morning while the rain keeps falling over the old "
    "city and the children walk down the street near the market with a smile on his face.",
    "two dogs.",
    "a young girl is riding a horse on the beach , which is probably for the best.",
    "music",
    "the president is eating food.",
]


@pytest.fixture(scope="module")
def encoder(tiny_bert_dir):
    """The tiny random checkpoint as a SentenceEncoder (mean pooling). Shared by the module's
    tests: each test that changes it (train mode, pooling) restores what it changed."""
    return SentenceEncoder.from_pretrained(tiny_bert_dir)


def manual_hidden(encoder, sentences):
    batch = tokenize(encoder.tokenizer, sentences, max_length=encoder.max_length)
    encoder.bert.eval()
    with torch.no_grad():
        out = encoder.bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    return out["last_hidden_state"], batch["attention_mask"]


@contextlib.contextmanager
def recorded_bert_calls(encoder):
    """Inside: a list that gets, for every call of encoder.bert, its attention mask, whether
    it ran in train mode, and whether inference mode was on."""
    calls = []

    def hook(module, inputs, output):
        calls.append({"mask": inputs[1].clone(), "training": module.training,
                      "inference_mode": torch.is_inference_mode_enabled()})

    handle = encoder.bert.register_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def trained_flow(dim: int, data: torch.Tensor) -> Glow:
    """A Glow whose ActNorm is data-initialised and whose weights are perturbed: far from identity."""
    torch.manual_seed(0)
    flow = Glow(dim, num_blocks=2)
    flow.train()
    with torch.no_grad():
        flow(data)  # ActNorm data-dependent initialisation
        for p in flow.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return flow.eval()


# ----------------------------------------------------------------------------- encode

def test_encode_shapes_and_dtype(encoder):
    dim = encoder.bert.config.hidden_size
    assert encoder.dim == dim
    vectors = encoder.encode(SENTENCES)
    assert vectors.shape == (len(SENTENCES), dim)
    assert vectors.dtype == torch.float32 and vectors.device.type == "cpu"
    assert torch.isfinite(vectors).all()
    single = encoder.encode("a man is playing a guitar.")
    assert single.shape == (dim,)
    assert torch.allclose(single, vectors[0], atol=TOL)
    assert encoder.encode([]).shape == (0, dim)
    assert encoder.encode(iter(SENTENCES[:2])).shape == (2, dim)  # any iterable


def test_encode_keeps_input_order(encoder):
    batched = encoder.encode(SENTENCES, batch_size=3)
    alone = torch.stack([encoder.encode(s) for s in SENTENCES])
    assert (batched - alone).abs().max() < TOL
    # Distinct sentences give distinct vectors, so a permutation could not pass the check above.
    assert torch.cdist(alone, alone).add(torch.eye(len(SENTENCES))).min() > 1e-3
    assert (encoder.encode(SENTENCES, batch_size=1) - alone).abs().max() < TOL


def test_mean_pooling_is_masked_mean(encoder):
    hidden, mask = manual_hidden(encoder, SENTENCES)
    m = mask.unsqueeze(-1).float()
    expected = (hidden * m).sum(1) / m.sum(1)
    assert (mask == 0).any()
    assert (encoder.encode(SENTENCES, batch_size=4) - expected).abs().max() < TOL
    # Not the unmasked mean: padding must not leak in.
    assert (hidden.mean(1) - expected).abs().max() > 1e-3


def test_cls_pooling(encoder, tiny_bert_dir):
    cls = SentenceEncoder.from_pretrained(tiny_bert_dir, pooling="cls")
    assert cls.pooling == "cls"
    hidden, _ = manual_hidden(cls, SENTENCES)
    assert (cls.encode(SENTENCES, batch_size=2) - hidden[:, 0]).abs().max() < TOL
    with pytest.raises(ValueError, match="pooling"):
        SentenceEncoder(cls.bert, cls.tokenizer, pooling="max")


def test_normalize(encoder):
    vectors = encoder.encode(SENTENCES, normalize=True)
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5)
    raw = encoder.encode(SENTENCES)
    assert torch.allclose(vectors, raw / raw.norm(dim=-1, keepdim=True), atol=1e-6)
    assert encoder.encode(SENTENCES[0], normalize=True).norm().item() == pytest.approx(1.0, abs=1e-5)


def test_encode_restores_training_flag(encoder):
    try:
        encoder.train()
        first = encoder.encode(SENTENCES[:3])
        assert encoder.training and encoder.bert.training
        assert torch.equal(first, encoder.encode(SENTENCES[:3]))  # dropout off inside encode
        encoder.eval()
        encoder.encode(SENTENCES[:3])
        assert not encoder.training and not encoder.bert.training
    finally:
        encoder.eval()


def test_encode_runs_in_eval_and_inference_mode(encoder):
    try:
        encoder.train()
        with recorded_bert_calls(encoder) as calls:
            encoder.encode(SENTENCES, batch_size=3)
        assert len(calls) == 3
        assert all(c["inference_mode"] and not c["training"] for c in calls), calls
    finally:
        encoder.eval()


def test_encode_batches_sentences_of_similar_length(encoder):
    lengths = [len(ids) for ids in encoder.tokenizer(SENTENCES)["input_ids"]]
    with recorded_bert_calls(encoder) as calls:
        encoder.encode(SENTENCES, batch_size=3)
    batches = [c["mask"].sum(1).tolist() for c in calls]
    # Longest first, three at a time; each batch is padded to its own longest sentence only.
    by_length = sorted(lengths, reverse=True)
    assert [sorted(b, reverse=True) for b in batches] == [by_length[i:i + 3] for i in range(0, len(by_length), 3)]
    assert [c["mask"].shape[1] for c in calls] == [max(b) for b in batches]


def test_show_progress_bar(encoder, capsys):
    """The project's progress convention (``utils.progress``): a bar on a terminal, plain lines in a
    log (True: whichever stderr is, and no line for quick work), or a mode by name."""
    capsys.readouterr()
    encoder.encode(SENTENCES, batch_size=2)
    assert capsys.readouterr().err == ""
    encoder.encode(SENTENCES, batch_size=2, show_progress_bar=True)  # stderr is no terminal: lines, none this quick
    assert capsys.readouterr().err == ""
    n = len(SENTENCES)
    encoder.encode(SENTENCES, batch_size=2, show_progress_bar="lines")
    err = capsys.readouterr().err
    assert "\r" not in err and f"encode: {n}/{n} sentences (100%)" in err, err
    encoder.encode(SENTENCES, batch_size=2, show_progress_bar="bar")  # tqdm's bar, redrawn in place
    err = capsys.readouterr().err
    assert "encode:" in err and "\r" in err, err


def test_encode_precision_follows_the_encoder_setting(encoder):
    """encode() autocasts to encoder.precision; the default on the CPU is float32."""
    sentences = ["a man plays the guitar in the park", "two dogs run on the beach"]
    default = encoder.encode(sentences)
    try:
        encoder.precision = "fp32"
        fp32 = encoder.encode(sentences)
        encoder.precision = "bf16"
        bf16 = encoder.encode(sentences)
    finally:
        encoder.precision = None
    assert torch.equal(default, fp32)
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)
    assert torch.allclose(bf16, fp32, atol=0.1)


def test_encode_output_is_usable_by_autograd(encoder):
    vectors = encoder.encode(SENTENCES[:3])
    assert not vectors.requires_grad
    assert not vectors.is_inference() and not encoder.encode(SENTENCES[0]).is_inference()
    head = torch.nn.Linear(encoder.dim, 2)
    head(vectors).square().sum().backward()  # e.g. fitting a flow on cached embeddings
    assert head.weight.grad is not None


def test_long_sentences_truncated_to_model_positions(encoder):
    # The tiny model has 64 positions, fewer than the default max_length of 128.
    assert encoder.bert.config.max_position_embeddings < encoder.max_length
    long = " ".join(["the man is playing a guitar"] * 40)
    assert encoder.encode([long, "hi"]).shape == (2, encoder.dim)
    assert encoder.tokenize([long])["input_ids"].shape[1] == encoder.bert.config.max_position_embeddings
    short = encoder.encode([long, "hi"], max_length=8)
    assert short.shape == (2, encoder.dim)


def test_forward_matches_encode(encoder):
    batch = encoder.tokenize(SENTENCES)
    with torch.no_grad():
        out = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert (out - encoder.encode(SENTENCES)).abs().max() < TOL


# ----------------------------------------------------------------------------- checkpoints

def assert_loads_in_transformers(directory):
    model, info = transformers.BertModel.from_pretrained(str(directory), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info.get("mismatched_keys")


def test_save_and_load_without_flow(encoder, tmp_path):
    out = tmp_path / "enc"
    encoder.save_pretrained(out)
    assert {"config.json", "model.safetensors", "sentence_encoder.json"} <= {p.name for p in out.iterdir()}
    assert not (out / FLOW_FILE).exists()
    assert json.loads((out / "sentence_encoder.json").read_text())["flow"] is False
    again = SentenceEncoder.from_pretrained(out)
    assert again.flow is None and again.pooling == encoder.pooling and again.max_length == encoder.max_length
    assert torch.equal(again.encode(SENTENCES), encoder.encode(SENTENCES))
    assert_loads_in_transformers(out)


def test_save_and_load_with_flow(tiny_bert_dir, tmp_path):
    enc = SentenceEncoder.from_pretrained(tiny_bert_dir, pooling="cls", max_length=48)
    plain = enc.encode(SENTENCES)  # f(x)
    enc.flow = trained_flow(enc.dim, plain)
    with torch.no_grad():
        expected = enc.flow(plain)[0]
    with_flow = enc.encode(SENTENCES, batch_size=3)
    # Relative too: the flow's latents reach ~4, and float32 matmuls over batches of other
    # shapes (3 rows here, all rows above) round differently at ~1e-5 absolute.
    torch.testing.assert_close(with_flow, expected, rtol=1e-5, atol=TOL)
    assert (with_flow - plain).abs().max() > 1e-2  # the flow really does something
    enc.eval()
    with torch.no_grad():
        embed = enc.embed(**enc.tokenize(SENTENCES))
    assert (embed - plain).abs().max() < TOL  # embed is f(x), before the flow

    out = tmp_path / "enc"
    enc.save_pretrained(out)
    assert (out / FLOW_FILE).is_file()
    assert_loads_in_transformers(out)
    again = SentenceEncoder.from_pretrained(out)
    assert isinstance(again.flow, Glow) and again.pooling == "cls" and again.max_length == 48
    assert torch.equal(again.encode(SENTENCES), enc.encode(SENTENCES))

    # Saving an encoder without a flow over it removes the stale flow file.
    enc.flow = None
    enc.save_pretrained(out)
    assert not (out / FLOW_FILE).exists()
    assert SentenceEncoder.from_pretrained(out).flow is None


def test_run_directory_resolves_to_best(encoder, tmp_path):
    run = tmp_path / "runs" / "mirror-test"
    encoder.save_pretrained(run / "best")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert resolve_encoder_path(run) == run / "best"
    assert resolve_encoder_path(run / "best") == run / "best"
    assert torch.equal(SentenceEncoder.from_pretrained(run).encode(SENTENCES), encoder.encode(SENTENCES))


def test_run_directory_with_its_settings_resolves_to_best(encoder, tmp_path):
    """A run directory has a config.json of its own (the run's settings): it must still stand for best/."""
    run = tmp_path / "mirror-run"
    encoder.save_pretrained(run / "best")
    encoder.save_pretrained(run / "last")
    (run / "config.json").write_text(json.dumps({"stage": "mirror", "model": "bert-base-uncased", "lr": 1e-4}))
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "tb").mkdir()
    assert resolve_encoder_path(run) == run / "best"
    assert resolve_encoder_path(str(run)) == run / "best"
    assert torch.equal(SentenceEncoder.from_pretrained(run).encode(SENTENCES), encoder.encode(SENTENCES))


@pytest.mark.parametrize("entries", [("config.json", "tb"), ("config.json", "tb", "metrics.jsonl", "last"), ("tb",)])
def test_run_directory_without_best_is_a_clear_error(tmp_path, entries):
    run = tmp_path / "stopped-run"
    run.mkdir()
    for name in entries:
        if name == "config.json":
            (run / name).write_text(json.dumps({"stage": "mirror"}))
        elif name == "metrics.jsonl":
            (run / name).write_text("")
        else:
            (run / name).mkdir()
    for call in (resolve_encoder_path, SentenceEncoder.from_pretrained):
        with pytest.raises(CheckpointError) as e:
            call(run)
        message = str(e.value)
        assert str(run) in message and "best/" in message and "\n" not in message


def test_checkpoint_directories_and_hub_names_are_not_run_directories(tiny_bert_dir, tmp_path):
    assert resolve_encoder_path(tiny_bert_dir) == tiny_bert_dir
    assert resolve_encoder_path("bert-base-uncased") == "bert-base-uncased"
    # A checkpoint directory is one even when something beside its weights is called best/ or tb/.
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_bert_dir, checkpoint)
    (checkpoint / "tb").mkdir()
    (checkpoint / "best").mkdir()
    assert resolve_encoder_path(checkpoint) == checkpoint


def test_multitask_encoder_flag_uses_the_same_resolver():
    """One function turns a run directory into its checkpoint: SentenceEncoder.from_pretrained,
    multitask's --encoder (here) and pretrain's --init (tests/training/test_pretrain.py) all use it."""
    from bertcf.multitask import command

    assert command.runs.resolve_encoder_path is resolve_encoder_path


def test_vocab_fallback_for_directories_without_tokenizer(tiny_bert_dir, vocab_path, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert_dir / name, bare / name)
    with pytest.raises(CheckpointError, match="tokenizer"):
        SentenceEncoder.from_pretrained(bare)
    enc = SentenceEncoder.from_pretrained(bare, vocab=vocab_path)
    assert torch.allclose(enc.encode(SENTENCES), SentenceEncoder.from_pretrained(tiny_bert_dir).encode(SENTENCES),
                          atol=TOL)


# ----------------------------------------------------------------------------- data fixtures

def test_encode_tiny_data_dir(encoder, tiny_data_dir):
    """The shared tiny_data_dir fixture reads with bertcf.data and its sentences encode."""
    from bertcf.data import tasks as data

    sizes = {(task, split): len(data.read_task(tiny_data_dir, task, split))
             for task in ("sst", "qqp", "sts") for split in ("train", "dev", "test")}
    assert sizes == {(t, s): n for t in ("sst", "qqp", "sts") for s, n in (("train", 24), ("dev", 12), ("test", 8))}
    sst = data.read_task(tiny_data_dir, "sst", "train")
    assert {ex.label for ex in sst} == {0, 1, 2, 3, 4}
    sts = data.read_task(tiny_data_dir, "sts", "dev")
    assert all(0.0 <= ex.label <= 5.0 for ex in sts)
    vectors = encoder.encode([p.sentence1 for p in sts] + [p.sentence2 for p in sts], batch_size=8)
    assert vectors.shape == (2 * len(sts), encoder.dim) and torch.isfinite(vectors).all()


# ----------------------------------------------------------------------------- real checkpoint

def test_real_checkpoint_acceptance(real_bert_dir, capsys):
    """The issue's acceptance check on a real sentence-encoder checkpoint (e.g. all-MiniLM-L6-v2)."""
    hidden = json.loads((real_bert_dir / "config.json").read_text())["hidden_size"]
    encoder = SentenceEncoder.from_pretrained(real_bert_dir)
    vectors = encoder.encode(["a man is playing a guitar.", "a man plays the guitar."])
    assert vectors.shape == torch.Size([2, hidden])
    cosine = torch.nn.functional.cosine_similarity(vectors[0], vectors[1], dim=0).item()
    with capsys.disabled():
        print(f"\n[{real_bert_dir}] cos('a man is playing a guitar.', 'a man plays the guitar.') = {cosine:.4f}")
    assert cosine > 0.8, cosine
