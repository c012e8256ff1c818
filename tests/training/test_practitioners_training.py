"""Training as practitioners do it: batches without duplicates, several datasets in one run,
early stopping, CoSENT/AnglE and Matryoshka end to end through run_pretrain.py, and the truncated
vectors of a Matryoshka model (ours, sentence-transformers' truncate_dim, the ONNX export, the
encode and evaluate commands) equal."""
from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertcf import runs
from bertcf.cli import run_main
from bertcf.commands import pretrain
from bertcf.config.pretrain import MIX_SAMPLINGS
from bertcf.config.train import TrainConfig
from bertcf.errors import UsageError
from bertcf.training import TrainingLoop
from bertcf.training.sampler import MODES, NoDuplicatesSampler, TaskSampler, check_distinct

WORDS = "the a man woman dog cat band plays runs eats on in park street guitar piano red blue small big".split()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- the samplers ----------------------------------------------------------------------------------
def test_no_duplicates_sampler_never_repeats_a_text_in_a_batch_and_resumes():
    texts = [(f"premise {i // 3}", f"hypothesis {i}") for i in range(30)]  # each premise in 3 examples
    sampler = NoDuplicatesSampler(texts, seed=4)
    drawn = []
    for _ in range(12):
        batch = sampler.next(8)
        seen = [t for i in batch for t in texts[i]]
        assert len(batch) == 8 and len(seen) == len(set(seen))
        drawn += batch
    assert set(drawn) == set(range(30))  # nothing left out for good
    state = NoDuplicatesSampler(texts, seed=4)
    for _ in range(5):
        state.next(8)
    resumed = NoDuplicatesSampler(texts, seed=4)
    resumed.load_state_dict(json.loads(json.dumps(state.state_dict())))
    assert [resumed.next(8) for _ in range(7)] == [state.next(8) for _ in range(7)]
    with pytest.raises(UsageError, match="too few distinct texts"):
        NoDuplicatesSampler([("same", "x"), ("same", "y"), ("other", "z")], seed=0).next(3)
    # the check the commands make before writing anything: 3 disjoint pairs need 6 texts, there are 5
    with pytest.raises(UsageError, match="too few distinct texts, 5 in 3 examples where a batch of 3 needs 6"):
        check_distinct([("same", "x"), ("same", "y"), ("other", "z")], 3)
    check_distinct(texts, 8)  # the premises' data above, which fills its batches


def test_a_mixture_draws_its_parts_in_turn_or_by_size_as_stage_3_draws_tasks():
    """--mix-sampling's two modes are ``TaskSampler``'s, one part a step (the by-hand rates:
    round-robin cycles, proportional draws b 100 times in 1,000); a resumed sampler draws on alike."""
    chooser = TaskSampler("round-robin", {"a": 5, "b": 1, "c": 2}, 6, 0)
    assert [chooser.tasks_at(s)[0] for s in range(6)] == ["a", "b", "c", "a", "b", "c"]
    chooser = TaskSampler("proportional", {"a": 900, "b": 100}, 2000, 3)
    picks = [chooser.tasks_at(s)[0] for s in range(2000)]
    assert abs(picks.count("b") / 2000 - 0.1) < 0.03
    assert chooser.counts == {"a": picks.count("a"), "b": picks.count("b")}
    again = TaskSampler("proportional", {"a": 900, "b": 100}, 2000, 3)
    again.load_state_dict(chooser.state_dict())
    assert [again.tasks_at(s) for s in range(2000, 2050)] == [chooser.tasks_at(s) for s in range(2000, 2050)]
    assert again.counts == chooser.counts
    with pytest.raises(UsageError, match="b: no examples to train on"):
        TaskSampler("proportional", {"a": 3, "b": 0}, 10, 0)
    with pytest.raises(UsageError, match="drawn by an earlier version"):  # the chooser's state before the two were one
        again.load_state_dict({"step": 4, "generator": torch.Generator().get_state()})
    assert set(MIX_SAMPLINGS) < set(MODES)


# ---- early stopping ------------------------------------------------------------------------------------
def scripted(tmp_path, scores, patience):
    model = torch.nn.Linear(1, 1)
    config = TrainConfig(steps=len(scores) - 1, log_every=100, eval_every=1, device="cpu", precision="fp32",
                         patience=patience, progress="none")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    loop = TrainingLoop(config, runs.Run(tmp_path / "run", {}), {"model": model}, model.parameters(), {},
                        optimizer=opt, metric="score",
                        save_model=lambda d: (d / "weights.txt").write_text(str(loop.step)),
                        evaluate=lambda step: {"score": scores[step]}, items_per_step=1)
    return loop, lambda step: (model(torch.ones(1, 1)).sum(), {})


def test_patience_stops_after_that_many_evaluations_without_a_better_score(tmp_path, capsys):
    loop, step_fn = scripted(tmp_path / "a", [0.1, 0.5, 0.4, 0.45, 0.3, 0.9, 0.2], patience=3)
    summary = loop.fit(step_fn)
    assert (summary["step"], summary["best_step"], summary["stopped_early"]) == (4, 1, True)
    assert "early stop at step 4: no better score in 3 evaluations (--patience 3); best 0.5000 at step 1" in \
        capsys.readouterr().err
    assert (tmp_path / "a" / "run" / "best" / "weights.txt").read_text() == "1"
    loop, step_fn = scripted(tmp_path / "b", [0.1, 0.5, 0.4, 0.45, 0.3, 0.9, 0.2], patience=None)
    summary = loop.fit(step_fn)  # the whole run without patience
    assert summary["step"] == 6 and not summary["stopped_early"]
    loop, step_fn = scripted(tmp_path / "c", [0.1, 0.5, 0.4, 0.6, 0.3, 0.9, 0.2], patience=3)
    assert loop.fit(step_fn)["stopped_early"] is False  # always a better score in time


# ---- through run_pretrain.py ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """sts-dev.csv and sts-train.csv (scored pairs), corpus.txt, and an NLI file."""
    d = tmp_path_factory.mktemp("practitioners")
    rng = random.Random(0)

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 9)))
    for name, n in (("sts-dev.csv", 12), ("sts-train.csv", 24)):
        rows = ["\tid\tsentence1\tsentence2\tsimilarity"] + [f"{i}\tid{i}\t{sentence()}\t{sentence()}\t{i % 6}.0"
                                                             for i in range(n)]
        (d / name).write_text("\n".join(rows) + "\n")
    (d / "corpus.txt").write_text("\n".join(sentence() for _ in range(24)) + "\n")
    nli = ["premise\thypothesis\tlabel"]
    for _ in range(12):
        p = sentence()
        nli += [f"{p}\t{sentence()}\tentailment", f"{p}\t{sentence()}\tcontradiction"]
    (d / "nli.tsv").write_text("\n".join(nli) + "\n")
    return d


def argv(bert, data, out, *flags, steps=4):
    return ["--model", str(bert), "--data-dir", str(data), "--out-dir", str(out), "--steps", str(steps),
            "--batch-size", "4", "--eval-every", "2", "--log-every", "1", "--device", "cpu", "--precision", "fp32",
            "--progress", "none", *flags]


def quiet(args):
    with contextlib.redirect_stdout(io.StringIO()):
        return pretrain.run(args)


@pytest.mark.parametrize("method", ["cosent", "angle"])
def test_cosent_and_angle_train_on_scored_pairs(tiny_bert_dir, data, tmp_path, method):
    summary = quiet(argv(tiny_bert_dir, data, tmp_path / method, "--stage", "supervised", "--method", method,
                         "--scale", "10"))
    config = json.loads((tmp_path / method / "config.json").read_text())
    assert summary["step"] == 4 and (config["method"], config["scale"]) == (method, 10.0)
    assert (tmp_path / method / "best" / "model.safetensors").is_file()


def test_a_mixture_trains_each_part_logs_its_losses_and_resumes_bit_for_bit(tiny_bert_dir, data, tmp_path):
    mix = ["--stage", "mix", "--mix", f"simcse={data / 'corpus.txt'}", f"simcse-sup={data / 'nli.tsv'}",
           "--mix-sampling", "round-robin"]
    quiet(argv(tiny_bert_dir, data, tmp_path / "straight", *mix, steps=6))
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert {"train_loss_simcse", "train_loss_simcse-sup"} <= set(records[-1])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags = EventAccumulator(str(tmp_path / "straight" / "tb")).Reload().Tags()["scalars"]
    assert {"train/loss_simcse", "train/loss_simcse-sup", "eval/train_loss_simcse"} <= set(tags)
    quiet(argv(tiny_bert_dir, data, tmp_path / "part", *mix, steps=4))
    quiet(["--resume", "--out-dir", str(tmp_path / "part"), "--steps", "6"])
    straight, resumed = (load_file(str(tmp_path / d / "last" / "model.safetensors")) for d in ("straight", "part"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


@pytest.mark.parametrize("flags, message", [
    (["--stage", "mix", "--mix", "simcse=x"], "two or more parts"),
    (["--stage", "mix", "--mix", "simcse=a", "distill=b"], "METHOD one of"),
    (["--stage", "mix", "--mix", "simcse=a", "ct=b", "--corpus", "c"], "not --corpus"),
    (["--mix", "simcse=a", "ct=b"], "--mix is for --stage mix"),
    (["--method", "ct", "--matryoshka-dims", "32,16"], "--matryoshka-dims is a setting of mirror, simcse, "
                                                       "sbert-cosine, simcse-sup, distill, cosent, angle, not of ct"),
    (["--matryoshka-dims", "64,16"], "--matryoshka-dims 64 is wider than the 32 dimensions"),
    (["--scale", "5"], "--scale is a setting of cosent, angle, not of mirror"),
])
def test_bad_flags_are_one_line_and_exit_2(tiny_bert_dir, data, tmp_path, capsys, flags, message):
    args = argv(tiny_bert_dir, data, tmp_path / "bad", "--corpus", str(data / "corpus.txt"), *flags)
    if "--stage" in flags and "--corpus" not in flags:
        args = [a for a in args if a not in ("--corpus", str(data / "corpus.txt"))]
    assert run_main(pretrain.run, args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


@pytest.mark.parametrize("mix", [False, True])
def test_too_few_distinct_texts_for_a_batch_are_refused_before_anything_is_written(tiny_bert_dir, data, tmp_path,
                                                                                   capsys, mix):
    """--batch-sampler no-duplicates on 3 distinct texts cannot make a batch of 4: refused in one
    line before the step-0 evaluation writes best/, config.json and tb/, so the corrected command
    runs in the same --out (the run directory is not left holding a run)."""
    few = tmp_path / "few.txt"
    few.write_text("a man plays the red guitar in the park\nthe small dog runs on the big street\n"
                   "a blue cat eats in the street with a woman\n" * 4)
    out = tmp_path / "run"
    data_flags = (["--stage", "mix", "--mix", f"simcse={few}", f"simcse-sup={data / 'nli.tsv'}"] if mix
                  else ["--corpus", str(few), "--method", "simcse"])
    assert run_main(pretrain.run, argv(tiny_bert_dir, data, out, *data_flags, "--batch-sampler", "no-duplicates")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1, err  # one line (after the mixture's "note:" lines)
    assert err.strip().splitlines()[-1] == (
        f"error: a batch of 4 examples without a repeated text cannot be made: {'--mix part simcse' if mix else 'the data'}"
        f" has too few distinct texts, 3 in 12 examples where a batch of 4 needs 4 (give a smaller --batch-size, or "
        f"--batch-sampler random)")
    assert not out.exists()
    assert quiet(argv(tiny_bert_dir, data, out, *data_flags, "--batch-sampler", "random", steps=2))["step"] == 2


def test_an_empty_dataset_in_a_mixture_is_one_line(tiny_bert_dir, data, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("\n")
    args = argv(tiny_bert_dir, data, tmp_path / "bad", "--stage", "mix", "--mix", f"simcse={data / 'corpus.txt'}",
                f"ct={tmp_path / 'empty.txt'}")
    assert run_main(pretrain.run, args) == 2
    assert "empty.txt is empty" in capsys.readouterr().err


@pytest.fixture(scope="module")
def matryoshka_run(tiny_bert_dir, data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("matryoshka") / "run"
    quiet(argv(tiny_bert_dir, data, out, "--corpus", str(data / "corpus.txt"), "--method", "simcse",
               "--matryoshka-dims", "32,16,8", "--matryoshka-weights", "1,1,0.5"))
    return out


def test_a_matryoshka_run_keeps_its_widths(matryoshka_run):
    assert json.loads((matryoshka_run / "config.json").read_text())["matryoshka_dims"] == [32, 16, 8]
    assert json.loads((matryoshka_run / "best" / "sentence_encoder.json").read_text())["matryoshka_dims"] == [32, 16, 8]
    assert "Matryoshka widths: 32, 16, 8" in (matryoshka_run / "best" / "README.md").read_text()
    from bertcf import SentenceEncoder
    assert SentenceEncoder.from_pretrained(matryoshka_run).matryoshka_dims == (32, 16, 8)


SENTENCES = ["a man plays the guitar in the park", "the dog runs", "a small red cat eats", "two women sing"]


@pytest.mark.parametrize("normalize", [False, True])
def test_truncated_vectors_are_sentence_transformers_truncate_dims(matryoshka_run, tmp_path, normalize):
    from sentence_transformers import SentenceTransformer

    from bertcf import SentenceEncoder
    encoder = SentenceEncoder.from_pretrained(matryoshka_run)
    encoder.normalize = normalize
    encoder.save_pretrained(tmp_path / "model")  # with a Normalize module, or without
    ours = SentenceEncoder.from_pretrained(tmp_path / "model").encode(SENTENCES, truncate_dim=8)
    theirs = SentenceTransformer(str(tmp_path / "model"), truncate_dim=8, device="cpu").encode(SENTENCES)
    assert ours.shape == (4, 8)
    np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-5)
    # normalize asked for at encode time: unit vectors at the cut width, as normalize_embeddings gives them
    ours = SentenceEncoder.from_pretrained(tmp_path / "model").encode(SENTENCES, truncate_dim=8, normalize=True)
    theirs = SentenceTransformer(str(tmp_path / "model"), truncate_dim=8, device="cpu").encode(
        SENTENCES, normalize_embeddings=True)
    np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1, atol=1e-5)
    with pytest.raises(UsageError, match="--truncate-dim 64: the encoder's vectors have 32 dimensions"):
        encoder.encode(SENTENCES, truncate_dim=64)


def test_the_onnx_export_and_the_commands_truncate_alike(matryoshka_run, tmp_path, capsys):
    from bertcf import SentenceEncoder
    from bertcf.backend.onnx_runtime import OnnxEncoder
    from bertcf.commands import encode, export
    from bertcf.commands.evaluate import main as evaluate

    expected = SentenceEncoder.from_pretrained(matryoshka_run).encode(SENTENCES, truncate_dim=16).numpy()
    assert run_main(export.run, ["onnx", str(matryoshka_run), "--out", str(tmp_path / "onnx")]) == 0
    np.testing.assert_allclose(OnnxEncoder(tmp_path / "onnx").encode(SENTENCES, truncate_dim=16), expected, atol=1e-4)
    np.testing.assert_allclose(OnnxEncoder(tmp_path / "onnx").encode(SENTENCES, truncate_dim=16, normalize=True),
                               SentenceEncoder.from_pretrained(matryoshka_run).encode(SENTENCES, truncate_dim=16,
                                                                                      normalize=True), atol=1e-4)
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    for model in (matryoshka_run, tmp_path / "onnx"):
        out = tmp_path / f"{Path(model).name}.npy"
        assert run_main(encode.run, ["--model", str(model), "--input", str(tmp_path / "in.txt"), "--output", str(out),
                                     "--truncate-dim", "16", "--progress", "none", "--device", "cpu"]) == 0
        np.testing.assert_allclose(np.load(out), expected, atol=1e-4)
    assert run_main(encode.run, ["--model", str(matryoshka_run), "--input", str(tmp_path / "in.txt"), "--output",
                                 str(tmp_path / "x.npy"), "--truncate-dim", "33", "--device", "cpu"]) == 2
    assert "--truncate-dim 33" in capsys.readouterr().err
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": s}) + "\n"
                                               for i, s in enumerate(SENTENCES)))
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "a man plays guitar"}) + "\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\td0\t1\n")
    with contextlib.redirect_stdout(io.StringIO()):
        assert evaluate(["--encoder", str(matryoshka_run), "--tasks", "retrieval", "--retrieval-dir", str(root),
                         "--truncate-dim", "8", "--json", str(tmp_path / "r.json"), "--no-progress", "--device",
                         "cpu"]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["truncate_dim"] == 8 and result["retrieval"]["queries"] == 1


def test_early_stopping_through_the_command_keeps_best(tiny_bert_dir, data, tmp_path, capsys):
    """--patience 1 stops at the first evaluation without a better score; the run is the same run
    as far as it went (its metrics, its best/ bit for bit those of the same run given that many steps)."""
    corpus = ["--corpus", str(data / "corpus.txt"), "--lr", "3e-3"]
    quiet(argv(tiny_bert_dir, data, tmp_path / "early", *corpus, "--patience", "1", steps=40))
    early = [json.loads(line) for line in (tmp_path / "early" / "metrics.jsonl").read_text().splitlines()]
    stopped = early[-1]["step"]
    assert 0 < stopped < 40 and json.loads((tmp_path / "early" / "config.json").read_text())["patience"] == 1
    assert early[-1]["sts_spearman"] <= max(r["sts_spearman"] for r in early[:-1])
    assert f"early stop at step {stopped}" in capsys.readouterr().err
    quiet(argv(tiny_bert_dir, data, tmp_path / "short", *corpus, steps=stopped))
    short = [json.loads(line) for line in (tmp_path / "short" / "metrics.jsonl").read_text().splitlines()]
    assert short == early
    a, b = (load_file(str(tmp_path / d / "best" / "model.safetensors")) for d in ("early", "short"))
    assert all(torch.equal(a[k], b[k]) for k in a)
