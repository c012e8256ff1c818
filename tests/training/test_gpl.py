"""GenQ and GPL, the domain adaptation of a bi-encoder, end to end on tiny random models built here
(a T5 query generator with a word-level tokenizer, a BERT cross-encoder, the tiny BERT):

- GenQ (python -m bertcf.data genq) writes BEIR's layout that the BEIR reader reads back, draws as
  BEIR's generator (the sampling settings reach transformers' generate; with top-k 1 it is greedy
  decoding), and supervised SimCSE trains on it as MNRL;
- GPL (python -m bertcf.gpl) keeps each step's output in OUT: the margins are the cross-encoder's
  logit differences computed by transformers itself, the negatives are no positive of their
  query; a second call skips every step (nothing is loaded), an interrupted training continues to
  the weights of an uninterrupted run, a changed setting or a missing input is refused, and a
  generator or cross-encoder that cannot be loaded is one line and exit status 2.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    REPO,
    TINY_BERT_CONFIG,
    assert_one_error_line,
    load,
    make_hf_bert_dir,
    run_side_by_side,
    tensors,
    training_state,
)

from bertcf import runs
from bertcf.commands import data as data_command
from bertcf.data import beir, genq
from bertcf.data.negatives import read_margins, read_triplets
from bertcf.errors import UsageError
from bertcf.gpl import command as gpl_command
from bertcf.gpl import pipeline as gpl_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ("what is the best way to learn a guitar play piano dog cat run how do i make money online why can "
         "you cook rice find good school job in india speak public train read more books stop thinking about "
         "past english").split()
PASSAGES = ["what is the best way to learn the guitar", "how do i make money online", "how can i cook rice",
            "what is a good school in india", "how do i train a dog", "why do cats run", "how can i speak in public",
            "what is the best way to read more books", "how do i stop thinking about the past",
            "how can i learn english"]


@pytest.fixture(scope="module")
def generator_dir(tmp_path_factory) -> Path:
    """A random T5ForConditionalGeneration (1 layer each side, d_model 16) with a word-level tokenizer
    over WORDS that ends every input with </s>, as T5's does: built offline."""
    import tokenizers
    import transformers
    from tokenizers import models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2} | {w: i + 3 for i, w in enumerate(dict.fromkeys(WORDS))}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    directory = tmp_path_factory.mktemp("tiny-t5")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                         model_max_length=64).save_pretrained(str(directory))
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=len(vocab), d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                   num_decoder_layers=1, num_heads=2, pad_token_id=0, eos_token_id=1,
                                   decoder_start_token_id=0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory, vocab_path) -> Path:
    """A random BertForSequenceClassification with one output and its tokenizer (what
    sentence-transformers' CrossEncoder loads), weights spread enough that pairs score apart."""
    import transformers

    vocab_size = sum(1 for line in vocab_path.read_text(encoding="utf-8").splitlines() if line)
    torch.manual_seed(1)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        **(TINY_BERT_CONFIG | {"initializer_range": 0.5}), vocab_size=vocab_size, num_labels=1))
    directory = tmp_path_factory.mktemp("tiny-cross-encoder")
    model.save_pretrained(str(directory))
    transformers.BertTokenizerFast(vocab=str(vocab_path), do_lower_case=True).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def passages(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("passages") / "passages.txt"
    path.write_text("\n".join(PASSAGES) + "\n")
    return path


# ---- GenQ -------------------------------------------------------------------------------------------
def test_genq_writes_beirs_layout_with_beirs_sampling(generator_dir, passages, tmp_path, capsys, monkeypatch):
    import transformers

    calls, real = [], transformers.T5ForConditionalGeneration.generate

    def recording(self, *args, **kwargs):
        calls.append(kwargs)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(transformers.T5ForConditionalGeneration, "generate", recording)
    out = tmp_path / "genq"
    status = data_command.main(["genq", "--corpus", str(passages), "--out", str(out), "--generator",
                                str(generator_dir), "--query-max-length", "8", "--batch-size", "4", "--no-progress"])
    assert status == 0 and "queries for 10 passages" in capsys.readouterr().out
    assert {k: calls[0][k] for k in ("do_sample", "top_p", "top_k", "max_length", "num_return_sequences")} == dict(
        do_sample=True, top_p=0.95, top_k=25, max_length=8, num_return_sequences=3)
    assert "attention_mask" in calls[0] and len(calls) == 3  # 10 passages, 4 at a time
    data = beir.load(out, "train")
    assert data.corpus == {str(i + 1): p for i, p in enumerate(PASSAGES)}
    assert list(data.queries) == [f"genQ{i + 1}" for i in range(len(data.queries))]
    per_passage = {}
    for query, relevant in data.qrels.items():
        (passage, score), = relevant.items()
        assert score == 1 and data.queries[query].strip()
        per_passage.setdefault(passage, []).append(data.queries[query])
    assert all(len(q) == len(set(q)) <= 3 for q in per_passage.values()) and len(per_passage) == 10


def test_genq_with_top_k_1_is_greedy_decoding(generator_dir):
    """One token to sample from is the argmax: transformers' greedy decoding, passage by passage."""
    model, tokenizer = genq.load_generator(str(generator_dir))
    passages = {str(i): p for i, p in enumerate(PASSAGES[:5])}
    queries, qrels = genq.generate(passages, model, tokenizer, genq.Generation(1, top_k=1, max_length=8, batch_size=2),
                                   show_progress_bar=False)
    for passage, text in passages.items():
        ids = tokenizer([text], return_tensors="pt")
        greedy = tokenizer.batch_decode(model.generate(**ids, do_sample=False, max_length=8), skip_special_tokens=True)
        ours = [queries[q] for q, rel in qrels.items() if passage in rel]
        assert ours == [greedy[0].strip()] or (ours == [] and not greedy[0].strip())


def test_genq_then_mnrl_trains_the_encoder(generator_dir, passages, tiny_bert_dir, data_dir, tmp_path, capsys):
    from helpers import base_args, run_quiet

    out = tmp_path / "genq"
    assert data_command.main(["genq", "--corpus", str(passages), "--out", str(out), "--generator", str(generator_dir),
                              "--query-max-length", "8", "--no-progress"]) == 0
    summary, _ = run_quiet(base_args(tiny_bert_dir, data_dir, tmp_path / "run", steps=3, stage="supervised",
                                     method="simcse-sup", negatives="simcse", train_file=out, corpus=None))
    assert summary["step"] == 3
    pairs = len(beir.load(out, "train").queries)
    assert f"training on {pairs} (query, positive) pairs from {out}" in capsys.readouterr().err
    assert not torch.equal(*(load(d).bert.encoder.layer[0].output.dense.weight
                             for d in (tiny_bert_dir, tmp_path / "run" / "last")))


# ---- GPL --------------------------------------------------------------------------------------------
def gpl_argv(out, encoder, data_dir, *flags, steps=4):
    return ["--encoder", str(encoder), "--out", str(out), "--steps", str(steps), "--batch-size", "4",
            "--max-length", "24", "--eval-every", "2", "--warmup-steps", "1", "--lr", "1e-3", "--data-dir",
            str(data_dir), "--device", "cpu", "--precision", "fp32", "--progress", "none", "--range-max", "6",
            "--num-negatives", "2", *flags]


@pytest.fixture(scope="module")
def gpl_out(tmp_path_factory, generator_dir, cross_encoder_dir, passages, tiny_bert_dir, data_dir):
    """OUT of one whole GPL run: generated queries, negatives by the encoder, margins, 4 steps."""
    out = tmp_path_factory.mktemp("gpl") / "out"
    gpl_command.run(gpl_argv(out, tiny_bert_dir, data_dir, "--corpus", str(passages), "--generator",
                             str(generator_dir), "--query-max-length", "8", "--cross-encoder", str(cross_encoder_dir)))
    return out


def test_gpl_keeps_each_steps_output(gpl_out, cross_encoder_dir):
    import transformers

    queries = beir.load(gpl_out / "queries", "train")
    positives = {queries.queries[q]: {queries.corpus[d] for d in rel} for q, rel in queries.qrels.items()}
    triplets = read_triplets(gpl_out / "negatives-1.tsv")
    assert triplets and all(n not in positives[q] and n in PASSAGES and p in positives[q] for q, p, n in triplets)
    rows = read_margins(gpl_out / "margins.tsv")
    assert [r[:3] for r in rows] == list(dict.fromkeys(triplets))
    model = transformers.BertForSequenceClassification.from_pretrained(str(cross_encoder_dir)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(cross_encoder_dir))
    with torch.no_grad():
        def logits(texts):
            return model(**tokenizer([q for q, _ in texts], [p for _, p in texts], padding=True,
                                     return_tensors="pt")).logits[:, 0]
        expected = logits([(q, p) for q, p, *_ in rows]) - logits([(q, n) for q, _, n, _ in rows])
    torch.testing.assert_close(torch.tensor([m for *_, m in rows], dtype=torch.float32), expected, rtol=1e-4,
                               atol=1e-5)
    assert expected.abs().max() > 1e-3  # the margins are not all 0
    record = json.loads((gpl_out / "gpl.json").read_text())
    assert set(record) == {"queries", "negatives-1", "margins", "model"} and record["model"]["done"] is True
    config = json.loads((gpl_out / "model" / "config.json").read_text())
    assert (config["method"], config["train_file"], config["steps"]) == ("margin-mse", [str(gpl_out / "margins.tsv")],
                                                                          4)
    assert load(gpl_out / "model").encode(["how do i learn"]).shape == (1, 32)


def test_a_second_call_skips_every_step(gpl_out, tiny_bert_dir, data_dir, generator_dir, cross_encoder_dir, passages,
                                        capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a done step ran again")
    for module, name in ((genq, "load_generator"), (gpl_pipeline, "load_cross_encoder"),
                         (gpl_pipeline.pretraining, "run"), (gpl_pipeline, "mine_and_write")):
        monkeypatch.setattr(module, name, never)
    before = {p: p.stat().st_mtime_ns for p in gpl_out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert gpl_command.main(gpl_argv(gpl_out, tiny_bert_dir, data_dir, "--corpus", str(passages), "--generator",
                                     str(generator_dir), "--query-max-length", "8", "--cross-encoder",
                                     str(cross_encoder_dir))) == 0
    assert capsys.readouterr().out.count("is there; skipped") == 4
    assert {p: p.stat().st_mtime_ns for p in gpl_out.rglob("*") if p.is_file()} == before


def test_changed_settings_and_missing_inputs_are_refused(gpl_out, tiny_bert_dir, data_dir, generator_dir, passages,
                                                         cross_encoder_dir, tmp_path, capsys):
    import shutil

    flags = ["--corpus", str(passages), "--generator", str(generator_dir), "--query-max-length", "8"]
    with pytest.raises(UsageError, match=r"margins.tsv was made with cross_encoder .* \(now 'other'\)"):
        gpl_command.run(gpl_argv(gpl_out, tiny_bert_dir, data_dir, *flags, "--cross-encoder", "other"))
    copy = tmp_path / "out"
    shutil.copytree(gpl_out, copy)
    (copy / "margins.tsv").unlink()
    with pytest.raises(UsageError, match=r"model is there but .*margins.tsv, which it is made from, is not"):
        gpl_command.run(gpl_argv(copy, tiny_bert_dir, data_dir, *flags, "--cross-encoder", str(cross_encoder_dir)))
    with pytest.raises(UsageError, match="belong to the GPL command itself"):
        gpl_command.run(gpl_argv(copy, tiny_bert_dir, data_dir, *flags, "--", "--method", "simcse"))
    with pytest.raises(UsageError, match="--out-dir belong to the GPL command itself"):  # an abbreviation of it
        gpl_command.run(gpl_argv(copy, tiny_bert_dir, data_dir, *flags, "--", "--out-d", "x"))
    # a flag run_pretrain.py does not know is refused before step 1, in one line
    with pytest.raises(SystemExit) as stopped:
        gpl_command.run(gpl_argv(copy, tiny_bert_dir, data_dir, *flags, "--", "--stepz", "3"))
    assert stopped.value.code == 2 and "unrecognized arguments: --stepz 3" in capsys.readouterr().err


def test_an_interrupted_training_continues_to_the_uninterrupted_weights(tiny_bert_dir, data_dir, cross_encoder_dir,
                                                                         tmp_path, monkeypatch, vocab_path):
    """Given (query, positive) pairs, two retrievers; the training stopped at step 2 of 4 (as by Ctrl-C)
    continues when the command is run again, to the weights of run_pretrain.py's 4 steps in one go."""
    from bertcf.commands import pretrain
    from bertcf.training.loop import TrainingLoop

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("query\tpositive\n" + "".join(f"{p.replace('how', 'tell me how')}\t{p}\n" for p in PASSAGES))
    other = make_hf_bert_dir(tmp_path / "other-retriever", vocab_path, seed=5)
    out = tmp_path / "out"
    argv = gpl_argv(out, tiny_bert_dir, data_dir, "--queries", str(pairs), "--retriever", str(tiny_bert_dir),
                    str(other), "--cross-encoder", str(cross_encoder_dir), "--", "--log-every", "1")
    real_log = TrainingLoop._log
    monkeypatch.setattr(TrainingLoop, "_log", lambda self, loss, scalars: real_log(self, loss, scalars)
                        or self.step == 2)
    result = gpl_command.run(argv)
    assert result["model"]["interrupted"] and json.loads((out / "gpl.json").read_text())["model"]["done"] is False
    assert training_state(out / "model")["step"] == 2
    assert read_triplets(out / "negatives-2.tsv") != read_triplets(out / "negatives-1.tsv")
    monkeypatch.setattr(TrainingLoop, "_log", real_log)
    gpl_command.run(argv)
    assert json.loads((out / "gpl.json").read_text())["model"]["done"] is True
    assert training_state(out / "model")["step"] == 4
    assert [s["session"] for s in runs.read_environment(out / "model")] == ["start", "resume"]
    pretrain.run(step_4_command_line(out / "margins.tsv", tmp_path / "straight", tiny_bert_dir, data_dir)
                 + ["--log-every", "1"])
    resumed, uninterrupted = (tensors(d / "last" / "model.safetensors") for d in (out / "model", tmp_path / "straight"))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def step_4_command_line(margins, out_dir, encoder, data_dir) -> list[str]:
    """run_pretrain.py's flags for GPL's step 4 of ``gpl_argv``: MarginMSE with GPL's defaults
    (linear decay, the last checkpoint kept, the dot product) and the settings gpl_argv gives."""
    return ["--stage", "supervised", "--method", "margin-mse", "--train-file", str(margins), "--out-dir", str(out_dir),
            "--model", str(encoder), "--steps", "4", "--batch-size", "4", "--lr", "1e-3", "--warmup-steps", "1",
            "--lr-schedule", "linear", "--max-length", "24", "--eval-every", "2", "--margin-score", "dot",
            "--select-on", "last", "--data-dir", str(data_dir), "--device", "cpu", "--precision", "fp32",
            "--progress", "none"]


def test_step_4_builds_the_config_run_pretrain_would_resolve(tiny_bert_dir, data_dir, tmp_path):
    """GPL's training step is a PretrainConfig built from GPL's typed settings (and the flags after
    --, parsed once with GPL's own), not command-line words parsed again: the same settings as
    run_pretrain.py's command line, resolved the same way, its command line GPL's own; continued,
    the same as run_pretrain.py --resume."""
    from bertcf.config import pretrain as pretrain_config

    argv = gpl_argv(tmp_path / "out", tiny_bert_dir, data_dir, "--queries", "q.tsv", "--", "--log-every", "3")
    config = gpl_pipeline.train_config(gpl_command.parse(argv), tmp_path / "out")
    command = pretrain_config.parse(step_4_command_line(tmp_path / "out" / "margins.tsv", tmp_path / "out" / "model",
                                                        tiny_bert_dir, data_dir) + ["--log-every", "3"])
    assert config.command == shlex.join(["python", "-m", "bertcf.gpl", *argv])
    assert config.replace(command=None) == command.replace(command=None)
    (tmp_path / "out" / "model" / "last").mkdir(parents=True)
    (tmp_path / "out" / "model" / "last" / runs.STATE_FILE).write_bytes(b"")
    (tmp_path / "out" / "model" / "config.json").write_text(json.dumps(command.to_dict()))
    resumed = gpl_pipeline.train_config(gpl_command.parse(argv), tmp_path / "out")
    again = pretrain_config.parse(["--resume", "--out-dir", str(tmp_path / "out" / "model"), "--device", "cpu",
                                   "--precision", "fp32", "--progress", "none"])
    assert resumed.resume and resumed.replace(command=None) == again.replace(command=None)


def test_flags_after_the_separator_that_are_gpls_are_refused_even_at_their_default(tiny_bert_dir, data_dir,
                                                                                      tmp_path):
    """-- --stage mirror (run_pretrain.py's default) would have replaced step 4's --stage supervised."""
    with pytest.raises(UsageError, match="--stage belong to the GPL command itself"):
        gpl_command.parse(gpl_argv(tmp_path, tiny_bert_dir, data_dir, "--queries", "q.tsv", "--", "--stage", "mirror"))


def test_a_model_that_cannot_be_loaded_is_one_line_and_exit_status_2(tiny_bert_dir, data_dir, passages, tmp_path,
                                                                      capsys):
    out = tmp_path / "out"
    status = gpl_command.main(gpl_argv(out, tiny_bert_dir, data_dir, "--corpus", str(passages), "--generator",
                                       str(tmp_path / "no-generator")))
    assert status == 2
    assert_one_error_line(capsys, f"--generator {tmp_path / 'no-generator'} cannot be loaded (not found")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("query\tpositive\n" + "".join(f"{p} ?\t{p}\n" for p in PASSAGES))
    status = gpl_command.main(gpl_argv(out, tiny_bert_dir, data_dir, "--queries", str(pairs), "--corpus",
                                       str(passages), "--cross-encoder", str(tmp_path / "no-ce")))
    assert status == 2 and not (out / "negatives-1.tsv").exists()  # a local path is checked before step 1
    assert_one_error_line(capsys, f"--cross-encoder {tmp_path / 'no-ce'} cannot be loaded (not found")


def test_a_cross_encoder_that_is_none_is_refused_before_any_step(tiny_bert_dir, data_dir, passages, tmp_path, capsys,
                                                                 monkeypatch):
    """A plain BERT (no classification head: transformers would start one at random, whose margins
    are noise) is refused as evaluate --rerank refuses it, and a local path that is not there is
    our one line alone; both before step 1, not after the hours of steps 1 and 2."""
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("query\tpositive\n" + "".join(f"{p} ?\t{p}\n" for p in PASSAGES))
    out = tmp_path / "out"
    status = gpl_command.main(gpl_argv(out, tiny_bert_dir, data_dir, "--queries", str(pairs), "--corpus",
                                       str(passages), "--cross-encoder", str(tiny_bert_dir)))
    assert status == 2
    assert_one_error_line(capsys, f"--cross-encoder {tiny_bert_dir} is not a cross-encoder")
    assert not out.exists()  # nothing ran
    monkeypatch.chdir(tmp_path)
    status = gpl_command.main(gpl_argv(out, tiny_bert_dir, data_dir, "--queries", str(pairs), "--corpus",
                                       str(passages), "--cross-encoder", "./no-ce"))
    assert status == 2
    assert_one_error_line(capsys, "--cross-encoder ./no-ce cannot be loaded (not found")
    assert not out.exists()


@pytest.mark.slow  # starts python -m bertcf.gpl twice, side by side
def test_a_hub_name_offline_is_one_line_and_exit_status_2(tmp_path, tiny_bert_dir, passages, data_dir):
    env = {k: v for k, v in os.environ.items()} | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
                                                    "BERTCF_OFFLINE": "1"}
    argv = [sys.executable, "-m", "bertcf.gpl", "--encoder", str(tiny_bert_dir), "--corpus", str(passages), "--device",
            "cpu"]
    # the training step's evaluation file is missing: refused before step 1, not after it; each its own --out
    done = run_side_by_side({"nodata": argv + ["--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "nodata")],
                             "offline": argv + ["--out", str(tmp_path / "out2"), "--data-dir", str(data_dir)]},
                            cwd=REPO, env=env)
    proc = done["nodata"]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "nodata/sts-dev.csv not found" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out" / "queries").exists()
    proc = done["offline"]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --generator BeIR/query-gen-msmarco-t5-base-v1 cannot be loaded (offline: not in the local Hugging Face "
        "cache, and the hub cannot be reached)")


def test_the_quora_recipe_end_to_end(tiny_data_dir, tiny_bert_dir, cross_encoder_dir, tmp_path):
    """The measurement's commands on tiny CS224N files: the Quora train duplicates that share no
    question with the dev duplicates as a set to train on (qrels/train.tsv), GPL on those queries
    with a cross-encoder given as a run directory (its best/), then retrieval on the dev duplicates'
    set before and after, by dot product and cosine."""
    import shutil

    from bertcf.commands import evaluate

    data, train, test = tiny_data_dir, tmp_path / "quora-train", tmp_path / "quora"
    assert data_command.main(["beir-quora", "--data-dir", str(data), "--queries-from", "train", "--split", "train",
                              "--exclude-questions-of", "dev", "--out", str(train)]) == 0
    assert data_command.main(["beir-quora", "--data-dir", str(data), "--out", str(test)]) == 0
    assert data_command.main(["beir-quora", "--data-dir", str(data), "--queries-from", "train",
                              "--exclude-questions-of", "train", "--out", str(tmp_path / "bad")]) == 2
    trained, tested = beir.load(train, "train"), beir.load(test)
    assert trained.corpus == tested.corpus and trained.queries
    seen = set(trained.qrels) | {d for rel in trained.qrels.values() for d in rel}
    assert not seen & (set(tested.qrels) | {d for rel in tested.qrels.values() for d in rel})
    cross_run = tmp_path / "cross"
    shutil.copytree(cross_encoder_dir, cross_run / "best")
    (cross_run / "metrics.jsonl").write_text("")
    out = tmp_path / "gpl"
    assert gpl_command.main(gpl_argv(out, tiny_bert_dir, data, "--queries", str(train), "--cross-encoder",
                                     str(cross_run), steps=2)) == 0
    for encoder in (tiny_bert_dir, out / "model"):
        for score in ("dot", "cos"):
            result = evaluate.run(["--encoder", str(encoder), "--tasks", "retrieval", "--retrieval-dir", str(test),
                                   "--retrieval-score", score, "--device", "cpu", "--no-progress"])
            assert 0 <= result["retrieval"]["ndcg@10"] <= 1


def test_a_setting_of_another_method_after_the_separator_is_refused_before_step_1(tiny_bert_dir, data_dir, passages,
                                                                                  tmp_path, capsys):
    out = tmp_path / "out"
    status = gpl_command.main(gpl_argv(out, tiny_bert_dir, data_dir, "--corpus", str(passages), "--", "--temperature",
                                       "0.1"))
    assert status == 2 and not out.exists()
    assert_one_error_line(capsys, "--temperature is a setting of mirror, simcse, --stage joint, simcse-sup, not of "
                                  "margin-mse")
