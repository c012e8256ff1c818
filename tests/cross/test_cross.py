"""``python -m bertcf.cross``: training a cross-encoder end to end on a tiny random BERT and a few
CS224N rows (the run directory, best/ scoring in sentence-transformers as here, metrics.json equal to
``evaluate``), its losses against sentence-transformers' BinaryCrossEntropyLoss and
CrossEntropyLoss, resume bit-identity, the evaluation of a bi-encoder by hand, and bad input in one
line with exit status 2."""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import write_cs224n_files, write_senteval
from safetensors.torch import load_file

from bertcf.cli import run_main
from bertcf.cross import command
from bertcf.data.senteval import read_stsb
from bertcf.data.tasks import read_qqp, read_sts
from bertcf.evaluation.metrics import pearson, spearman
from bertcf.models.cross_encoder import CrossEncoder, pad_pairs
from bertcf.models.encoder import SentenceEncoder

st = pytest.importorskip("sentence_transformers", reason="the reference CrossEncoder is sentence-transformers'")

pytestmark = pytest.mark.usefixtures("one_thread")


def argv(bert_dir, data_dir, out_dir, steps=4, **flags) -> list[str]:
    settings = {"model": bert_dir, "data-dir": data_dir, "out-dir": out_dir, "steps": steps, "eval-every": 2,
                "log-every": 1, "batch-size": 8, "max-length": 48, "warmup-steps": 1, "lr": 1e-3, "device": "cpu",
                "precision": "fp32"} | {k.replace("_", "-"): v for k, v in flags.items()}
    out = ["train"]
    for k, v in settings.items():
        if v is None or v is False:
            continue
        out += [f"--{k}"] if v is True else [f"--{k}", *map(str, v if isinstance(v, list) else [v])]
    return out


def run_quiet(args) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):
        return command.run(args)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = write_cs224n_files(tmp_path_factory.mktemp("cross-data"))
    write_senteval(d / "SentEval")  # STS-B test, scored at the end
    return d


@pytest.fixture(scope="module")
def sts_run(tiny_bert_dir, data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cross-run") / "run"
    run_quiet(argv(tiny_bert_dir, data_dir, out))
    return out


def test_sts_run_end_to_end(sts_run, data_dir):
    for name in ("config.json", "metrics.jsonl", "metrics.json", "best/model.safetensors", "best/config.json",
                 "best/tokenizer.json", "best/README.md", "last/training_state.pt"):
        assert (sts_run / name).is_file(), name
    config = json.loads((sts_run / "config.json").read_text())
    assert config["select_on"] == "sts-dev" and config["train_file"] == [str(data_dir / "sts-train.csv")]
    assert config["head"] == "regression" and config["command"].startswith("python -m bertcf.cross train")
    lines = [json.loads(line) for line in (sts_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 2, 4] and all("sts_dev_spearman" in r for r in lines)
    metrics = json.loads((sts_run / "metrics.json").read_text())
    assert metrics["step"] == max(lines, key=lambda r: r["sts_dev_spearman"])["step"]
    assert {"sts_dev_spearman", "sts_dev_pearson", "qqp_dev_acc", "stsb_test_spearman"} <= set(metrics)
    # best/ is a sentence-transformers CrossEncoder that scores as ours; metrics.json is those scores' Spearman
    pairs = read_sts(data_dir / "sts-dev.csv")
    texts = [(p.sentence1, p.sentence2) for p in pairs]
    ours = CrossEncoder.from_pretrained(sts_run)  # a run directory stands for its best/
    theirs = torch.as_tensor(st.CrossEncoder(str(sts_run / "best"), device="cpu").predict(texts))
    torch.testing.assert_close(ours.predict(texts), theirs, rtol=0, atol=1e-5)
    assert metrics["sts_dev_spearman"] == pytest.approx(spearman(theirs, [p.label for p in pairs]), abs=1e-6)
    qqp = read_qqp(data_dir / "quora-dev.csv")
    duplicate = torch.as_tensor(st.CrossEncoder(str(sts_run / "best"), device="cpu").predict(
        [(p.sentence1, p.sentence2) for p in qqp])) >= 0.5
    assert metrics["qqp_dev_acc"] == pytest.approx(
        sum(int(d) == p.label for d, p in zip(duplicate.tolist(), qqp)) / len(qqp), abs=1e-6)
    # the evaluate subcommand scores the same
    result = run_quiet(["evaluate", "--model", str(sts_run), "--data-dir", str(data_dir), "--device", "cpu"])
    for key in ("sts_dev_spearman", "qqp_dev_acc", "stsb_test_spearman"):
        assert result[key] == pytest.approx(metrics[key], abs=1e-6), key
    assert result["kind"] == "cross-encoder"


def test_the_weights_moved_and_the_card_says_cross_encoder(sts_run, tiny_bert_dir):
    start = load_file(str(tiny_bert_dir / "model.safetensors"))
    last = load_file(str(sts_run / "last" / "model.safetensors"))
    key = "encoder.layer.0.output.dense.weight"
    assert not torch.equal(start[key], last[f"bert.{key}"])
    assert "classifier.weight" in last
    card = (sts_run / "best" / "README.md").read_text()
    assert "from sentence_transformers import CrossEncoder" in card and "SentenceTransformer(" not in card


def test_losses_equal_sentence_transformers(tiny_bert_dir, tmp_path):
    """Our regression and classification losses on a batch are sentence-transformers' own, on the
    same checkpoint (dropout off): its BinaryCrossEntropyLoss and CrossEntropyLoss, which tokenise
    the pairs themselves."""
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss, CrossEntropyLoss

    first = ["A man plays a guitar.", "How do I cook rice?", "The dog runs.", "hello there"]
    second = ["Someone plays music.", "What is the best way to cook rice?", "A cat sleeps.", "world"]
    for num_labels, labels in ((1, torch.tensor([0.9, 0.6, 0.0, 0.2])), (2, torch.tensor([1, 1, 0, 0]))):
        torch.manual_seed(num_labels)
        model = CrossEncoder.from_pretrained(tiny_bert_dir, num_labels=num_labels, hidden_dropout_prob=0.0,
                                             attention_probs_dropout_prob=0.0)
        model.save_pretrained(tmp_path / f"ce{num_labels}")
        ids, types = model.tokenize(list(zip(first, second)))
        input_ids, token_types, mask = pad_pairs(ids, types)
        logits = model(input_ids, mask, token_types)
        ours = (F.binary_cross_entropy_with_logits(logits[:, 0], labels) if num_labels == 1
                else F.cross_entropy(logits, labels))
        reference = st.CrossEncoder(str(tmp_path / f"ce{num_labels}"), device="cpu")
        reference.eval()
        loss = (BinaryCrossEntropyLoss if num_labels == 1 else CrossEntropyLoss)(reference)
        theirs = loss([first, second], labels)
        assert ours.item() == pytest.approx(theirs.item(), abs=1e-5), num_labels


def test_training_step_is_that_loss(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """The run's first logged loss is the BCE of the batch its sampler drew (dropout off)."""
    from bertcf.cross import training

    seen = {}
    real = training.pad_pairs

    def spy(ids, types, pad):
        seen.setdefault("ids", ids)
        return real(ids, types, pad)
    monkeypatch.setattr(training, "pad_pairs", spy)
    out = tmp_path / "run"
    run_quiet(argv(tiny_bert_dir, data_dir, out, steps=1, eval_every=1, dropout=0.0))
    logged = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    torch.manual_seed(11711)
    model = CrossEncoder.from_pretrained(tiny_bert_dir, num_labels=1, max_length=48, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
    pairs = read_sts(data_dir / "sts-train.csv")
    ids, types = model.tokenize([(p.sentence1, p.sentence2) for p in pairs])
    rows = [ids.index(x) for x in seen["ids"]]
    input_ids, token_types, mask = pad_pairs([ids[i] for i in rows], [types[i] for i in rows])
    expected = F.binary_cross_entropy_with_logits(model(input_ids, mask, token_types)[:, 0],
                                                  torch.tensor([pairs[i].label / 5 for i in rows]))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(out / "tb")).Reload()
    assert events.Scalars("train/loss")[0].value == pytest.approx(expected.item(), abs=1e-5)
    assert logged["step"] == 0


def last_tensors(out: Path) -> dict:
    return load_file(str(out / "last" / "model.safetensors"))


def test_sigterm_then_resume_is_bit_identical(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """SIGTERM during step 3 of 4 (the linear schedule's 4): last/ written, exit 143; --resume ends
    where an uninterrupted run ends, bit for bit."""
    import os
    import signal

    from bertcf.cross import training

    straight, part = tmp_path / "straight", tmp_path / "part"
    run_quiet(argv(tiny_bert_dir, data_dir, straight, steps=4, max_train_examples=10))
    real, calls = training.pad_pairs, {"n": 0}

    def batch_then_signal(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args)
    monkeypatch.setattr(training, "pad_pairs", batch_then_signal)
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_main(command.run, argv(tiny_bert_dir, data_dir, part, steps=4, max_train_examples=10)) == 143
    assert "stopped by SIGTERM at step 3" in capsys.readouterr().err
    assert not (part / "metrics.json").exists()
    monkeypatch.undo()
    summary = run_quiet(["train", "--resume", "--out-dir", str(part)])
    assert summary["step"] == 4
    a, b = last_tensors(straight), last_tensors(part)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((part / "metrics.json").read_text()) | {"checkpoint": None} == \
        json.loads((straight / "metrics.json").read_text()) | {"checkpoint": None}


def test_qqp_classification_selects_on_qqp_dev(tiny_bert_dir, data_dir, tmp_path):
    out = tmp_path / "qqp"
    run_quiet(argv(tiny_bert_dir, data_dir, out, steps=2, head="classification",
                   train_file=[data_dir / "quora-train.csv"]))
    config = json.loads((out / "config.json").read_text())
    assert config["select_on"] == "qqp-dev"
    assert "qqp_dev_acc" in json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    model = CrossEncoder.from_pretrained(out)
    assert model.num_labels == 2
    # QQP accuracy: label 1's softmax probability of at least 0.5 is a duplicate
    qqp = read_qqp(data_dir / "quora-dev.csv")
    p1 = model.predict([(p.sentence1, p.sentence2) for p in qqp], apply_softmax=True)[:, 1]
    expected = sum(int(v >= 0.5) == p.label for v, p in zip(p1.tolist(), qqp)) / len(qqp)
    assert json.loads((out / "metrics.json").read_text())["qqp_dev_acc"] == pytest.approx(expected, abs=1e-6)


def test_evaluate_a_bi_encoder_by_hand(tiny_bert_dir, data_dir):
    """A sentence encoder is scored by its cosines: Spearman, Pearson, and QQP duplicate at cos >= 0.5."""
    result = run_quiet(["evaluate", "--model", str(tiny_bert_dir), "--data-dir", str(data_dir), "--device", "cpu",
                        "--sets", "sts-dev,stsb-test"])
    assert result["kind"] == "bi-encoder" and "qqp_dev_acc" not in result
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    for key, pairs in (("sts_dev", read_sts(data_dir / "sts-dev.csv")),
                       ("stsb_test", read_stsb(data_dir / "SentEval" / "STS" / "STSBenchmark" / "sts-test.csv"))):
        cos = F.cosine_similarity(encoder.encode([p.sentence1 for p in pairs]),
                                  encoder.encode([p.sentence2 for p in pairs]))
        gold = [p.label for p in pairs]
        assert result[f"{key}_spearman"] == pytest.approx(spearman(cos, gold), abs=1e-6)
        assert result[f"{key}_pearson"] == pytest.approx(pearson(cos, gold), abs=1e-6)


@pytest.mark.parametrize("case", ["missing_train_file", "sts_classification", "nli_regression", "no_subcommand",
                                  "bad_subcommand", "bad_flag", "bad_model", "missing_dev", "evaluate_bad_set",
                                  "evaluate_bad_model", "nli_selected_on_sts", "train_bad_set",
                                  "train_set_without_file"])
def test_bad_input_is_one_line_and_status_2(case, tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    nli = tmp_path / "nli.tsv"
    nli.write_text("premise\thypothesis\tlabel\nA man plays.\tSomeone plays.\tentailment\n")
    args = {
        "missing_train_file": argv(tiny_bert_dir, data_dir, out, train_file=[tmp_path / "nope.csv"]),
        "sts_classification": argv(tiny_bert_dir, data_dir, out, head="classification"),
        "nli_regression": argv(tiny_bert_dir, data_dir, out, train_file=[nli]),
        "no_subcommand": [],
        "bad_subcommand": ["fit"],
        "bad_flag": argv(tiny_bert_dir, data_dir, out, head="ranking"),
        "bad_model": argv(tmp_path / "no-such-bert", data_dir, out),
        "missing_dev": argv(tiny_bert_dir, data_dir, out, sts_dev=tmp_path / "absent.csv"),
        "evaluate_bad_set": ["evaluate", "--model", str(tiny_bert_dir), "--data-dir", str(data_dir), "--sets", "mrpc"],
        "evaluate_bad_model": ["evaluate", "--model", str(tmp_path / "absent"), "--data-dir", str(data_dir)],
        "nli_selected_on_sts": argv(tiny_bert_dir, data_dir, out, train_file=[nli], head="classification",
                                    select_on="sts-dev"),
        "train_bad_set": argv(tiny_bert_dir, data_dir, out, sets="mrpc"),
        # the file of a set asked for is missing: refused before training, not after it
        "train_set_without_file": argv(tiny_bert_dir, data_dir, out, sets="stsb-test",
                                       senteval_dir=tmp_path / "absent"),
    }[case]
    try:
        status = run_main(command.run, args)
    except SystemExit as e:  # argparse's own errors
        status = e.code
    assert status == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0] and "Traceback" not in captured.err, err
    assert not out.exists()  # nothing half-written


def test_sets_bound_the_final_scoring_and_each_shows_its_progress(tiny_bert_dir, data_dir, tmp_path, capsys,
                                                                   monkeypatch):
    """``--sets`` names the pair sets best/ is scored on at the end (``none``: none); each set's
    scoring, during training and at the end, writes its pairs and the time left (issue 59: a ten-step
    run scored QQP dev's 3,954 pairs for minutes without a word)."""
    from bertcf.utils import progress

    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    out = tmp_path / "run"
    run_quiet(argv(tiny_bert_dir, data_dir, out, steps=1, eval_every=1, sets="sts-dev", progress="lines"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert "sts_dev_spearman" in metrics and "qqp_dev_acc" not in metrics and "stsb_test_spearman" not in metrics
    err = capsys.readouterr().err
    assert "\r" not in err
    assert re.search(r"^score sts-dev: (\d+)/\1 pairs \(100%\), [\d,.]+ pairs/s", err, re.M), err
    assert re.search(r"^eval sts-dev: (\d+)/\1 pairs \(100%\)", err, re.M), err
    out = tmp_path / "none"
    run_quiet(argv(tiny_bert_dir, data_dir, out, steps=1, eval_every=1, sets="none", progress="none"))
    assert set(json.loads((out / "metrics.json").read_text())) == {"checkpoint", "step"}
    assert capsys.readouterr().err == ""
    result = run_quiet(["evaluate", "--model", str(out), "--data-dir", str(data_dir), "--device", "cpu", "--sets",
                        "qqp-dev", "--progress", "lines"])
    assert "qqp_dev_acc" in result and re.search(r"^score qqp-dev: (\d+)/\1 pairs", capsys.readouterr().err, re.M)


@pytest.mark.parametrize("subcommand", ["train", "evaluate"])
def test_help_shows_every_default_once(subcommand):
    """As every command's --help (tests/commands/test_cli.py): a flag with a value as its default
    shows it once; the others say in words what happens."""
    from bertcf.cross.config import build_parser

    parser = build_parser(subcommand)
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or action.default in (None, False):
            continue
        text = " ".join(formatter._expand_help(action).split())
        assert text.endswith(f"(default: {action.default})") and text.count("default") == 1, (action.dest, text)
