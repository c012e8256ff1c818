"""The cross-encoder (bertcf.models.cross_encoder): its checkpoint loads in sentence-transformers'
CrossEncoder and scores the same (within 1e-5: one label with its default sigmoid, a saved Identity,
three labels with and without softmax, long pairs cut to the length), a transformers
BertForSequenceClassification loads here and gives transformers' logits, the pair encoding's token
types, the activation read where sentence-transformers reads it, hub names from the cache, and bad
input in one line."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from helpers import offline_hub_cache

from bertcf.errors import UsageError
from bertcf.models.cross_encoder import IDENTITY, SIGMOID, CrossEncoder, is_cross_encoder
from bertcf.models.encoder import SentenceEncoder
from minbert import CheckpointError

st = pytest.importorskip("sentence_transformers", reason="the reference CrossEncoder is sentence-transformers'")

pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [("A man is playing a guitar.", "Someone plays music on the stage."),
         ("How do I learn english?", "What is the best way to learn english?"),
         ("hello", "world"),
         ("the quick brown fox jumps over the lazy dog " * 8, "a dog sleeps"),  # cut to the model's 64 tokens
         ("a cat", "the old company talks about the election near the market " * 4)]


def tiny_cross_encoder(bert_dir, num_labels=1, seed=0, **kwargs) -> CrossEncoder:
    """A random cross-encoder (dropout on, to check eval mode) whose classifier has visible biases."""
    torch.manual_seed(seed)
    model = CrossEncoder.from_pretrained(bert_dir, num_labels=num_labels, **kwargs)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 1.0)
        model.classifier.bias.normal_(0, 0.5)
    return model


def st_scores(directory, pairs=PAIRS, **predict) -> torch.Tensor:
    model = st.CrossEncoder(str(directory), device="cpu")
    return torch.as_tensor(model.predict(pairs, **predict))


@pytest.mark.parametrize("num_labels, activation", [(1, None), (1, IDENTITY), (3, None)])
def test_scores_equal_sentence_transformers(tiny_bert_dir, tmp_path, num_labels, activation):
    model = tiny_cross_encoder(tiny_bert_dir, num_labels, activation_fn=activation)
    model.save_pretrained(tmp_path / "ce")
    ours = model.predict(PAIRS, batch_size=2)
    theirs = st_scores(tmp_path / "ce")
    assert ours.shape == theirs.shape == ((len(PAIRS),) if num_labels == 1 else (len(PAIRS), num_labels))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    if num_labels == 1 and activation is None:  # the default: a sigmoid, so the scores lie in (0, 1)
        assert 0 < ours.min() and ours.max() < 1 and model.activation_fn == SIGMOID
    # the raw logits, and sentence-transformers' softmax
    torch.testing.assert_close(model.predict(PAIRS, raw_logits=True),
                               st_scores(tmp_path / "ce", activation_fn=torch.nn.Identity()), rtol=0, atol=1e-5)
    if num_labels > 1:
        torch.testing.assert_close(model.predict(PAIRS, apply_softmax=True),
                                   st_scores(tmp_path / "ce", apply_softmax=True), rtol=0, atol=1e-5)
    # one pair alone: a 0-d score, as sentence-transformers returns one
    assert model.predict(PAIRS[0]).shape == (() if num_labels == 1 else (num_labels,))
    # the checkpoint loads back here with the same scores
    torch.testing.assert_close(CrossEncoder.from_pretrained(tmp_path / "ce").predict(PAIRS), ours, rtol=0, atol=1e-6)


def test_checkpoint_is_a_transformers_sequence_classifier(tiny_bert_dir, tmp_path):
    model = tiny_cross_encoder(tiny_bert_dir, 2)
    model.save_pretrained(tmp_path / "ce")
    config = json.loads((tmp_path / "ce" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 2
    assert config["sentence_transformers"]["activation_fn"] == IDENTITY
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "ce").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "ce")
    enc = tok([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True, truncation=True, return_tensors="pt")
    assert enc["input_ids"].shape[1] <= 64  # the tokenizer was saved with the model's length
    with torch.no_grad():
        expected = hf(**enc).logits
    torch.testing.assert_close(model.predict(PAIRS, raw_logits=True), expected, rtol=0, atol=1e-5)
    assert is_cross_encoder(tmp_path / "ce") and not is_cross_encoder(tiny_bert_dir)


def test_loads_a_transformers_checkpoint_and_its_logits(tiny_bert_dir, vocab_path, tmp_path):
    """A BertForSequenceClassification that transformers wrote (with the older activation key):
    minBERT's logits are transformers' (an independent implementation), token types included."""
    torch.manual_seed(3)
    config = transformers.BertConfig.from_pretrained(tiny_bert_dir, num_labels=1)
    hf = transformers.BertForSequenceClassification(config).eval()
    hf.config.sbert_ce_default_activation_function = IDENTITY  # sentence-transformers before v4 wrote this
    hf.save_pretrained(tmp_path / "hf")
    transformers.BertTokenizerFast(vocab=str(vocab_path), do_lower_case=True).save_pretrained(tmp_path / "hf")
    ours = CrossEncoder.from_pretrained(tmp_path / "hf")
    assert ours.num_labels == 1 and ours.activation_fn == IDENTITY
    tok = ours.tokenizer
    enc = tok([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True, truncation="longest_first", max_length=64,
              return_tensors="pt")
    with torch.no_grad():
        expected = hf(**enc).logits[:, 0]
        without_types = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0]
    got = ours.predict(PAIRS)  # Identity: the logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert (got - without_types).abs().max() > 1e-4  # the token types are read
    torch.testing.assert_close(got, st_scores(tmp_path / "hf"), rtol=0, atol=1e-5)  # its activation is honoured


def test_pair_encoding_is_the_tokenizers(tiny_bert_dir):
    model = CrossEncoder.from_pretrained(tiny_bert_dir)
    ids, types = model.tokenize(PAIRS[:2])
    enc = model.tokenizer(["A man is playing a guitar."], ["Someone plays music on the stage."])
    assert ids[0] == enc["input_ids"][0] and types[0] == enc["token_type_ids"][0]
    sep = model.tokenizer.sep_token_id
    first_sep = ids[0].index(sep)
    assert ids[0][0] == model.tokenizer.cls_token_id and ids[0][-1] == sep
    assert types[0] == [0] * (first_sep + 1) + [1] * (len(ids[0]) - first_sep - 1)
    long_ids, _ = model.tokenize([PAIRS[3]])
    assert len(long_ids[0]) == model.max_length == 64  # tokenizer without a limit: the position embeddings


def test_saved_sentence_transformers_directory_and_its_activation(tiny_bert_dir, tmp_path):
    """A directory sentence-transformers itself saved (modules.json, config_sentence_transformers.json
    naming the activation): loads here with that activation, and scores as sentence-transformers does."""
    tiny_cross_encoder(tiny_bert_dir, 1).save_pretrained(tmp_path / "ce")
    reference = st.CrossEncoder(str(tmp_path / "ce"), device="cpu", activation_fn=torch.nn.Tanh())
    reference.save_pretrained(str(tmp_path / "st"))
    assert (tmp_path / "st" / "modules.json").is_file()
    ours = CrossEncoder.from_pretrained(tmp_path / "st")
    assert ours.activation_fn == "torch.nn.modules.activation.Tanh"
    torch.testing.assert_close(ours.predict(PAIRS), st_scores(tmp_path / "st"), rtol=0, atol=1e-5)
    # an activation outside torch is not imported (sentence-transformers without trust_remote_code)
    config = json.loads((tmp_path / "ce" / "config.json").read_text())
    config["sentence_transformers"]["activation_fn"] = "os.system"
    (tmp_path / "ce" / "config.json").write_text(json.dumps(config))
    assert CrossEncoder.from_pretrained(tmp_path / "ce").activation_fn == SIGMOID


def test_fresh_classifier_and_labels(tiny_bert_dir, tmp_path):
    torch.manual_seed(0)
    a = CrossEncoder.from_pretrained(tiny_bert_dir, num_labels=3)
    torch.manual_seed(0)
    b = CrossEncoder.from_pretrained(tiny_bert_dir, num_labels=3)
    assert torch.equal(a.classifier.weight, b.classifier.weight) and a.classifier.bias.abs().sum() == 0
    assert a.classifier.weight.std().item() == pytest.approx(0.1, rel=0.3)  # the config's initializer_range
    a.save_pretrained(tmp_path / "three")
    with pytest.raises(CheckpointError, match="3 labels, not 1"):
        CrossEncoder.from_pretrained(tmp_path / "three", num_labels=1)
    # a sentence encoder's directory (sentence-transformers' modules.json: Transformer, Pooling) starts one too
    SentenceEncoder.from_pretrained(tiny_bert_dir).save_pretrained(tmp_path / "bi")
    assert (tmp_path / "bi" / "modules.json").is_file()
    fresh = CrossEncoder.from_pretrained(tmp_path / "bi")
    assert fresh.num_labels == 1 and fresh.activation_fn == SIGMOID and not is_cross_encoder(tmp_path / "bi")


def test_loads_a_hub_name_from_the_cache(monkeypatch, tmp_path, tiny_bert_dir):
    model = tiny_cross_encoder(tiny_bert_dir, 1)
    model.save_pretrained(tmp_path / "ce")
    name = "bertcf-test/ms-marco-tiny"
    offline_hub_cache(monkeypatch, tmp_path, name, tmp_path / "ce")
    from_hub = CrossEncoder.from_pretrained(name)
    torch.testing.assert_close(from_hub.predict(PAIRS), model.predict(PAIRS), rtol=0, atol=1e-6)


def test_unknown_hub_name_offline_is_one_line(monkeypatch, tmp_path, tiny_bert_dir):
    offline_hub_cache(monkeypatch, tmp_path, "bertcf-test/other", tiny_bert_dir)
    name = "cross-encoder/ms-marco-MiniLM-L-6-v2"
    with pytest.raises(CheckpointError) as e:
        CrossEncoder.from_pretrained(name)
    message = str(e.value)
    assert name in message and "offline" in message and "\n" not in message


def test_bad_checkpoints_and_pairs(tiny_bert_dir, tmp_path):
    other = tmp_path / "roberta"
    shutil.copytree(tiny_bert_dir, other)
    config = json.loads((other / "config.json").read_text()) | {"model_type": "roberta"}
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="roberta model"):
        CrossEncoder.from_pretrained(other)
    with pytest.raises(CheckpointError, match="not found"):
        CrossEncoder.from_pretrained(tmp_path / "absent")
    stacked = tmp_path / "stacked"  # a sentence-transformers cross-encoder with a module after the classifier
    tiny_cross_encoder(tiny_bert_dir).save_pretrained(stacked)
    (stacked / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "x.Transformer"},
                                                      {"idx": 1, "name": "1", "path": "1_Dense", "type": "x.Dense"}]))
    with pytest.raises(CheckpointError, match="2 modules"):
        CrossEncoder.from_pretrained(stacked)
    model = CrossEncoder.from_pretrained(tiny_bert_dir)
    with pytest.raises(UsageError, match="pairs of two texts"):
        model.predict([("one", "two", "three")])
    assert model.predict([]).shape == (0,)


def test_real_minilm_scores_equal_sentence_transformers(real_bert_dir, tmp_path):
    """A cross-encoder on the real MiniLM ($BERTCF_REAL_BERT), a random classifier: the same scores."""
    torch.manual_seed(0)
    model = CrossEncoder.from_pretrained(real_bert_dir, num_labels=1)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 0.05)
    model.save_pretrained(tmp_path / "ce")
    torch.testing.assert_close(model.predict(PAIRS), st_scores(tmp_path / "ce"), rtol=0, atol=1e-5)
    torch.testing.assert_close(model.predict(PAIRS, raw_logits=True),
                               st_scores(tmp_path / "ce", activation_fn=torch.nn.Identity()), rtol=0, atol=1e-4)
