"""bertcf.experiments: the report's tables in one command. A tiny suite (tiny random BERT, a
few rows of each CS224N file, 2 steps a stage) writes every output; a second invocation
reruns nothing; interrupted stages continue; changed settings are refused; the objectives
rows train and rerun nothing; alignment and uniformity match a direct computation."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import record_pretrainings, write_cs224n_files, write_senteval

from bertcf import experiments as exp
from bertcf.commands import experiments
from bertcf.data.tasks import PairExample
from bertcf.multitask import evaluation as multitask_metrics
from bertcf.multitask.tasks import builtin_tasks
from bertcf.evaluation.metrics import alignment, uniformity

BEST_DIRS = ["simcse", "mirror", "flow", "minbert-whitening", "bertcf", "simcse-joint", "minbert-joint", "mirror-flow",
             "mirror-whitening"]
WHITENING = ("minbert-whitening", "mirror-whitening")  # closed form: no steps
OBJECTIVES = ["bsl", "ct", "tsdae", "mlm"]

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread


# ---- the maths -----------------------------------------------------------------------------------------
def test_alignment_and_uniformity_on_known_vectors():
    eye = torch.eye(4)
    assert uniformity(eye) == pytest.approx(-4.0)          # every pair at squared distance 2: log exp(-4)
    assert uniformity(3 * eye) == pytest.approx(-4.0)      # rows are normalised first
    assert alignment(eye, eye) == pytest.approx(0.0)
    assert alignment(eye, eye.roll(1, dims=0)) == pytest.approx(2.0)  # orthogonal pairs: ||x - y||^2 = 2
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([[math.cos(0.3), math.sin(0.3)], [0.0, 1.0]])
    assert alignment(x, y) == pytest.approx((2 - 2 * math.cos(0.3)) / 2)


class StubEncoder:
    """encode(): fixed vectors by sentence."""

    def __init__(self, vectors: dict):
        self.vectors = vectors

    def encode(self, sentences, batch_size=64):
        return torch.stack([self.vectors[s] for s in sentences])


def test_pair_analysis_matches_a_direct_computation():
    v = {"a": torch.tensor([1.0, 0.0, 0.0]), "b": torch.tensor([0.0, 1.0, 0.0]),
         "c": torch.tensor([0.0, 0.0, 1.0]), "d": torch.tensor([1.0, 1.0, 0.0])}
    pairs = [PairExample("1", "a", "b", 1.0), PairExample("2", "a", "c", 0.0), PairExample("3", "c", "d", 1.0),
             PairExample("4", "b", "a", 0.0)]
    result = exp.pair_analysis(StubEncoder(v), pairs)
    n = {k: t / t.norm() for k, t in v.items()}
    expected_alignment = ((n["a"] - n["b"]).pow(2).sum() + (n["c"] - n["d"]).pow(2).sum()) / 2
    sentences = list(n.values())  # distinct sentences only: a, b, c, d
    sq = [(sentences[i] - sentences[j]).pow(2).sum() for i in range(4) for j in range(i + 1, 4)]
    expected_uniformity = torch.stack([torch.exp(-2 * d) for d in sq]).mean().log()
    assert result["alignment"] == pytest.approx(float(expected_alignment), abs=1e-6)
    assert result["uniformity"] == pytest.approx(float(expected_uniformity), abs=1e-6)
    assert (result["pairs"], result["positives"], result["sentences"]) == (4, 2, 4)


def test_finetune_metric_names_and_prediction_files(tmp_path):
    # The names are the ones bertcf.multitask writes to metrics.json.
    assert (set(exp.FINETUNE_METRICS.values())
            == {t.metric_key for t in builtin_tasks().values()} | {multitask_metrics.SELECTION_METRIC})
    for qqp in ("qqp_acc", "para_acc"):  # para_acc: a metrics.json written before QQP had one name
        m = exp.finetune_metrics({"sst_acc": 0.4, qqp: 0.9, "sts_pearson": 0.1, "mean_dev": 0.3,
                                          "sst_dev_examples": 12})
        assert m == {"sst_accuracy": 0.4, "qqp_accuracy": 0.9, "sts_pearson": 0.1, "mean_dev": 0.3}
    (tmp_path / "p.csv").write_text("id \t Predicted_Is_Paraphrase \nabc , 1.0\n def , 0\n")
    assert exp.read_predictions(tmp_path / "p.csv") == {"abc": "1.0", "def": "0"}


# ---- the tiny suite ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def suite_data(tmp_path_factory) -> Path:
    d = write_cs224n_files(tmp_path_factory.mktemp("exp-data") / "data")
    lines = [f"{s} number {i} of the little corpus ." for i, s in enumerate(
        ["the man is playing a guitar", "a woman reads a book in the park", "the dog runs on the beach",
         "two children sing a song on the stage", "the president talks about the election"] * 4)]
    (d.parent / "corpus.txt").write_text("\n".join(lines) + "\n")
    return d


def suite_argv(command, bert, data, out, *more) -> list[str]:
    return [command, "--model", str(bert), "--data-dir", str(data), "--out-dir", str(out),
            "--corpus", str(data.parent / "corpus.txt"), "--steps-scale", "0.0002", "--max-length", "24",
            "--pretrain-args", "--batch-size 4 --log-every 1", "--device", "cpu", "--seed", "3", *more]


@pytest.fixture(scope="module")
def suite(tiny_bert_dir, suite_data, tmp_path_factory):
    """`all --no-finetune` once: 7 stages of 2 steps and 2 whitenings, 10 encoders evaluated."""
    out = tmp_path_factory.mktemp("exp") / "out"
    summary = experiments.run(suite_argv("all", tiny_bert_dir, suite_data, out, "--no-finetune"))
    return out, summary


def mtimes(out: Path, names=BEST_DIRS) -> dict:
    return {name: (out / "stages" / name / "best" / "model.safetensors").stat().st_mtime_ns for name in names}


@pytest.mark.slow
def test_suite_writes_every_output(suite):
    out, summary = suite
    for name in ("table1.md", "table1.json", "ablations.md", "ablations.json", "analysis.md", "analysis.json",
                 "qualitative.md", "suite.json", "figures/sts-dev-cosines-minbert.png",
                 "figures/sts-dev-cosines-bertcf.png"):
        assert (out / name).is_file(), name
        assert (out / name).stat().st_size > 0
    for png in (out / "figures").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.rglob(".*.tmp*")), "a temporary file was left behind"
    # One seed: the directories a one-seed OUT has always had, and nothing for other seeds.
    assert {p.name for p in out.iterdir()} == {"stages", "eval", "figures", "tb", "suite.json", "claims.md",
                                               "claims.json", "table1.md", "table1.json", "ablations.md",
                                               "ablations.json", "analysis.md", "analysis.json", "qualitative.md"}
    assert sorted(p.name for p in (out / "stages").iterdir()) == sorted(BEST_DIRS)
    # What it ran with: the runner's in suite.json, each run's in its environment.json; no lock left.
    import importlib.metadata
    recorded = json.loads((out / "suite.json").read_text())["environment"]
    assert recorded["packages"]["torch"] == importlib.metadata.version("torch") and recorded["device"] == "cpu"
    for name in BEST_DIRS:
        stage = out / "stages" / name
        assert json.loads((stage / "environment.json").read_text())["sessions"][0]["session"] == "start"
        assert not (stage / ".lock").exists()

    table1 = json.loads((out / "table1.json").read_text())
    assert [r["name"] for r in table1["rows"]] == ["MinBERT", "MinBERT-SimCSE", "MinBERT-Mirror", "MinBERT-flow",
                                                    "MinBERT-whitening", "BERT-CF"]
    for row in table1["rows"]:
        sts = row["ours"]["sts_spearman"]
        assert -1 <= sts["mean"] <= 1 and sts["n"] == 1 and sts["sd"] is None and sts["per_seed"] == {"3": sts["mean"]}
        assert row["ours"]["sst_accuracy"]["n"] == 0  # --no-finetune
        assert row["report"] == exp.REPORT_TABLE1.get(row["name"], dict.fromkeys(
            exp.REPORT_TABLE1["MinBERT"]))  # the report has no whitening row
    assert table1["rows"][0]["encoder"] == table1["settings"]["model"]
    assert table1["rows"][-1]["encoder"].endswith(os.path.join("stages", "bertcf", "best"))
    md = (out / "table1.md").read_text()
    assert "| BERT-CF |" in md and "0.760" in md and "0.841" in md  # the report's numbers beside ours
    assert "| MinBERT-whitening |" in md and "no randomness of its own" in md

    ablations = json.loads((out / "ablations.json").read_text())
    assert [r["name"] for r in ablations["rows"]] == ["SimCSE-joint", "MinBERT-joint", "Mirror-flow",
                                                      "Mirror-whitening"]
    assert all(-1 <= r["ours"]["sts_spearman"]["mean"] <= 1 for r in ablations["rows"])
    assert "0.629" in (out / "ablations.md").read_text()
    assert "Mirror-whitening: BERT-whitening" in (out / "ablations.md").read_text()

    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["sample"]["pairs"] == 24 and analysis["sample"]["positives"] == 12
    for row in analysis["rows"]:
        assert 0 <= row["ours"]["alignment"]["mean"] <= 4
        assert -4 <= row["ours"]["uniformity"]["mean"] <= 0
        assert row["report"] == exp.REPORT_ANALYSIS.get(row["name"], {"alignment": None, "uniformity": None})
    qualitative = (out / "qualitative.md").read_text()
    assert qualitative.count("\n| ") >= 11  # header + 10 sampled STS pairs

    # TensorBoard: the two histograms and the tables as text.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(out / "tb"), size_guidance={"histograms": 0, "tensors": 0})
    acc.Reload()
    assert set(acc.Tags()["histograms"]) == {"sts_dev_cosines/MinBERT", "sts_dev_cosines/BERT-CF"}
    assert any("table1" in t for t in acc.Tags()["tensors"])

    # Each stage ran once, from the right checkpoint, and is marked finished.
    for name in BEST_DIRS:
        marker = json.loads((out / "stages" / name / exp.MARKER).read_text())
        assert marker["status"] == "done" and marker["summary"]["step"] == (0 if name in WHITENING else 2)
    config = json.loads((out / "stages" / "bertcf" / "config.json").read_text())
    assert config["stage"] == "joint" and config["init"].endswith(os.path.join("stages", "mirror", "best"))
    whitened = json.loads((out / "stages" / "mirror-whitening" / "config.json").read_text())
    assert (whitened["stage"], whitened["whiten_on"]) == ("whiten", "corpus")
    assert whitened["init"].endswith(os.path.join("stages", "mirror", "best")) and whitened["whitening"]["dim"] >= 1
    assert json.loads((out / "stages" / "minbert-whitening" / "config.json").read_text())["init"] is None
    assert json.loads((out / "stages" / "minbert-joint" / "config.json").read_text())["unfreeze_encoder"] is True


@pytest.mark.slow
def test_second_invocation_reruns_nothing(suite, tiny_bert_dir, suite_data, monkeypatch, capsys):
    out, _ = suite
    before = mtimes(out)
    calls = record_pretrainings(monkeypatch, run=False)
    # The settings not given come from OUT/suite.json.
    experiments.run(["all", "--out-dir", str(out), "--no-finetune"])
    assert calls == []
    assert mtimes(out) == before
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[1/9] MinBERT-SimCSE: mirror stage --method simcse from --model")
    assert sum("finished earlier, reused" in line for line in lines) == 9


@pytest.mark.slow
def test_several_seeds(suite, tmp_path, monkeypatch, capsys):
    """--seeds 3,4 on an OUT that --seed 3 filled: seed 3's runs are reused where they are, seed 4's
    live in seeds/4/ and chain from seed 4's own runs; every cell has mean, sd, n and per_seed; the
    claims are tested over both seeds; a second call reruns nothing."""
    out = tmp_path / "out"
    shutil.copytree(suite[0], out)
    before = mtimes(out)
    calls = record_pretrainings(monkeypatch)
    experiments.run(["all", "--out-dir", str(out), "--no-finetune", "--seeds", "3,4"])
    assert mtimes(out) == before
    seed4 = out / "seeds" / "4" / "stages"
    assert [a[a.index("--out-dir") + 1] for a in calls] == [str(seed4 / name) for name in BEST_DIRS]
    assert all(a[a.index("--seed") + 1] == "4" for a in calls)
    config = json.loads((seed4 / "bertcf" / "config.json").read_text())
    assert config["seed"] == 4 and config["init"] == str(seed4 / "mirror" / "best")
    assert "[seed 4]" in capsys.readouterr().out

    table1 = {r["name"]: r["ours"] for r in json.loads((out / "table1.json").read_text())["rows"]}
    for name, ours in table1.items():
        sts = ours["sts_spearman"]
        assert sts["n"] == 2 and set(sts["per_seed"]) == {"3", "4"}
        values = list(sts["per_seed"].values())
        assert sts["mean"] == pytest.approx(sum(values) / 2)
        assert sts["sd"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))
    assert table1["MinBERT"]["sts_spearman"]["sd"] == 0  # --model itself: the same encoder for both seeds
    assert table1["MinBERT-whitening"]["sts_spearman"]["sd"] == 0  # no randomness of its own, on --model
    assert " ± " in (out / "table1.md").read_text() and "over the 2 seeds 3, 4" in (out / "table1.md").read_text()
    ablations = json.loads((out / "ablations.json").read_text())
    assert all(r["ours"]["sts_spearman"]["n"] == 2 for r in ablations["rows"])

    claims = json.loads((out / "claims.json").read_text())["claims"]
    pairs = {(c["a"], c["b"]) for c in claims}
    assert pairs == {("BERT-CF", "Mirror-flow"), ("BERT-CF", "MinBERT-joint"), ("MinBERT-Mirror", "MinBERT"),
                     ("MinBERT-Mirror", "MinBERT-SimCSE"), ("MinBERT-flow", "MinBERT"), ("BERT-CF", "MinBERT-Mirror"),
                     ("MinBERT-flow", "MinBERT-whitening"), ("Mirror-flow", "Mirror-whitening"),
                     ("BERT-CF", "Mirror-whitening")}
    assert {(c["a"], c["b"]) for c in claims if not c["report_claim"]} == {
        ("MinBERT-flow", "MinBERT-whitening"), ("Mirror-flow", "Mirror-whitening"), ("BERT-CF", "Mirror-whitening")}
    everything = {r["name"]: r["ours"] for r in ablations["rows"]} | table1
    for c in claims:
        assert c["metric"] == "sts_spearman" and c["seeds"] == [3, 4]
        assert c["verdict"] in ("supported", "contradicted", "inconclusive")
        a, b = everything[c["a"]]["sts_spearman"]["mean"], everything[c["b"]]["sts_spearman"]["mean"]
        assert c["mean_difference"] == pytest.approx(a - b, abs=1e-9)  # the mean of the per-seed differences
        assert c["ci95"][0] <= c["ci95"][1]
    assert "| BERT-CF | Mirror-flow |" in (out / "claims.md").read_text()

    calls.clear()
    experiments.run(["all", "--out-dir", str(out), "--no-finetune"])  # the seeds come from suite.json
    assert calls == []
    assert capsys.readouterr().out.count("finished earlier, reused") == 18


@pytest.mark.slow
def test_mlm_base_is_shared_by_the_seeds(vocab_path, suite_data, tmp_path, capsys):
    config = write_config(vocab_path, tmp_path / "config")
    experiments.run(suite_argv("mlm-base", config, suite_data, tmp_path / "out", "--config", str(config),
                                "--mlm-steps", "3", "--no-finetune", "--seeds", "3,4", "--dry-run"))
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[")]
    assert sum("MLM base" in l for l in lines) == 1 and len(lines) == 1 + 2 * len(BEST_DIRS)
    assert sum("seeds/4/stages/" in l for l in lines) == len(BEST_DIRS)


@pytest.mark.slow
def test_interrupted_stages_continue(suite, tiny_bert_dir, suite_data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    shutil.copytree(suite[0], out)
    # stages/bertcf was killed after a checkpoint (last/ is there); stages/mirror-flow before its first one.
    marker = out / "stages" / "bertcf" / exp.MARKER
    marker.write_text(json.dumps(json.loads(marker.read_text()) | {"status": "running"}))
    mirror_flow = out / "stages" / "mirror-flow"
    shutil.rmtree(mirror_flow / "last")
    (mirror_flow / exp.MARKER).unlink()
    calls = record_pretrainings(monkeypatch)

    experiments.run(["all", "--out-dir", str(out), "--no-finetune", "--dry-run"])
    assert calls == []
    printed = capsys.readouterr().out
    assert "would continue with --resume" in printed and "would be cleared and started again" in printed

    experiments.run(["all", "--out-dir", str(out), "--no-finetune"])
    assert [a[a.index("--out-dir") + 1] for a in calls] == [str(out / "stages" / "bertcf"), str(mirror_flow)]
    assert "--resume" in calls[0] and "--resume" not in calls[1]
    printed = capsys.readouterr().out
    assert "(continuing the interrupted run)" in printed
    assert "(the interrupted attempt left no checkpoint: starting it again)" in printed
    for name in ("bertcf", "mirror-flow"):
        assert json.loads((out / "stages" / name / exp.MARKER).read_text())["status"] == "done"


@pytest.mark.slow
def test_sigterm_stops_after_the_current_run_and_the_next_call_continues(suite, tmp_path, monkeypatch, capsys):
    """SIGTERM during the second pretraining: it finishes its step and saves, the command exits 143;
    called again it reuses the first run, continues the second, and reruns nothing else."""
    import os
    import signal

    from bertcf.objectives import mirror

    out = tmp_path / "out"
    shutil.copytree(suite[0], out)
    for name in ("simcse", "mirror"):
        shutil.rmtree(out / "stages" / name)
    real, calls = mirror.span_mask, {"n": 0}

    def span_then_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # SimCSE's 2 steps, then Mirror's first
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)
    monkeypatch.setattr(mirror, "span_mask", span_then_signal)
    rows = ["--rows", "MinBERT-SimCSE,MinBERT-Mirror"]
    assert experiments.main(["table1", "--out-dir", str(out), "--no-finetune", *rows]) == 143
    assert "stopped by SIGTERM" in capsys.readouterr().err
    assert json.loads((out / "stages" / "simcse" / exp.MARKER).read_text())["status"] == "done"
    assert json.loads((out / "stages" / "mirror" / exp.MARKER).read_text())["status"] == "running"
    monkeypatch.undo()
    calls_after = record_pretrainings(monkeypatch)
    assert experiments.main(["table1", "--out-dir", str(out), "--no-finetune", *rows]) == 0
    assert len(calls_after) == 1 and "--resume" in calls_after[0]
    printed = capsys.readouterr().out
    assert "MinBERT-SimCSE: mirror stage --method simcse from --model -> stages/simcse, 2 steps" in printed
    assert "finished earlier, reused" in printed and "(continuing the interrupted run)" in printed


@pytest.mark.slow
def test_changed_settings_are_refused(suite, capsys):
    out, _ = suite
    assert experiments.main(["table1", "--out-dir", str(out), "--no-finetune", "--steps-scale", "0.0004"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "other settings" in err and "steps=2 (now 4)" in err


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_writes_nothing(tiny_bert_dir, suite_data, tmp_path, capsys):
    out = tmp_path / "out"
    experiments.run(suite_argv("ablations", tiny_bert_dir, suite_data, out, "--dry-run"))
    lines = capsys.readouterr().out.splitlines()
    heads = [l for l in lines if l.startswith("[")]
    assert [h.split(":")[0] for h in heads] == ["[1/6] MinBERT-SimCSE (for SimCSE-joint)",
                                                "[2/6] SimCSE-joint", "[3/6] MinBERT-joint",
                                                "[4/6] MinBERT-Mirror (for Mirror-flow)", "[5/6] Mirror-flow",
                                                "[6/6] Mirror-whitening"]
    assert any(l.strip().startswith("python run_pretrain.py --stage joint --method simcse --init") for l in lines)
    assert not out.exists()


def test_dry_run_on_a_fresh_clone_lists_what_is_missing(tmp_path, capsys):
    """No data, no corpus, no model: the dry run still prints the plan, then what is missing, and exits 0."""
    status = experiments.main(["all", "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "out"),
                              "--dry-run"])
    assert status == 0
    printed = capsys.readouterr().out
    assert "[8/15] Mirror-flow" in printed and "[15/15] BERT-CF: multitask" in printed and "then: evaluate MinBERT" in printed
    # the whitening rows: the closed-form stage, on the encoder below, with no training length
    whiten = [line.strip() for line in printed.splitlines() if "--stage whiten" in line]
    assert len(whiten) == 2 and all("--steps" not in line and "--max-length" not in line for line in whiten)
    assert "--init " + str(tmp_path / "out" / "stages" / "mirror" / "best") in whiten[1] and "--init" not in whiten[0]
    assert "[9/15] Mirror-whitening: whiten stage from stages/mirror -> stages/mirror-whitening, closed form" in printed
    assert "missing before this can run:\n  - --data-dir " in printed
    (tmp_path / "data").mkdir()
    experiments.main(["all", "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "out"), "--dry-run"])
    printed = capsys.readouterr().out
    assert "  - no pretraining corpus: give --corpus FILE or --corpus-from-tasks" in printed
    assert "  - missing input file(s): " in printed and "sts-dev.csv" in printed
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_output_directory_from_before_the_renames_is_reused(suite, tmp_path, monkeypatch, capsys):
    """suite.json written when --pretrain-args was --stage-args: its settings still apply, and the
    old flag still parses (with a note)."""
    out = tmp_path / "out"
    shutil.copytree(suite[0], out)
    saved = json.loads((out / "suite.json").read_text())
    saved["settings"]["stage_args"] = saved["settings"].pop("pretrain_args")
    (out / "suite.json").write_text(json.dumps(saved))
    calls = record_pretrainings(monkeypatch, run=False)
    experiments.run(["all", "--out-dir", str(out), "--no-finetune"])
    experiments.run(["all", "--out-dir", str(out), "--no-finetune", "--stage-args", "--batch-size 4 --log-every 1"])
    assert calls == []
    captured = capsys.readouterr()
    assert sum("finished earlier, reused" in line for line in captured.out.splitlines()) == 18
    assert "note: --stage-args is now --pretrain-args" in captured.err


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no-data-dir", "bad-flag", "bad-row", "bad-pretrain-args", "no-corpus", "bad-scale"])
def test_bad_input_is_one_line_and_status_2(case, tiny_bert_dir, suite_data, tmp_path, capsys):
    out = tmp_path / "out"
    argv = suite_argv("table1", tiny_bert_dir, suite_data, out, "--no-finetune")
    if case == "no-data-dir":
        argv[argv.index("--data-dir") + 1] = str(tmp_path / "missing")
    elif case == "bad-flag":
        argv.append("--no-such-flag")
    elif case == "bad-row":
        argv += ["--rows", "MinBERT,Nope"]
    elif case == "bad-pretrain-args":
        argv[argv.index("--pretrain-args") + 1] = "--batch-size 1"
    elif case == "no-corpus":
        i = argv.index("--corpus")
        del argv[i:i + 2]
    elif case == "bad-scale":
        argv[argv.index("--steps-scale") + 1] = "0"
    try:
        status = experiments.main(argv)
    except SystemExit as e:  # argparse's error(): exit status 2
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err, err
    assert not (out / "stages").exists()


@pytest.mark.slow
def test_objectives_rows_then_second_invocation_reruns_nothing(suite, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    shutil.copytree(suite[0], out)  # the suite's settings (suite.json) and its MinBERT-Mirror stage
    experiments.run(["objectives", "--out-dir", str(out)])
    objectives = json.loads((out / "objectives.json").read_text())
    names = ["MinBERT-BSL", "MinBERT-CT", "MinBERT-TSDAE", "MinBERT-MLM"]
    assert [r["name"] for r in objectives["rows"]] == names
    for row, method in zip(objectives["rows"], OBJECTIVES):
        assert math.isfinite(row["ours"]["sts_spearman"]["mean"]) and -1 <= row["ours"]["sts_spearman"]["mean"] <= 1
        assert row["report"] == {"sts_spearman": None}  # the report has no numbers for these
        assert row["encoder"].endswith(os.path.join("stages", method, "best"))
        config = json.loads((out / "stages" / method / "config.json").read_text())
        assert (config["stage"], config["method"], config["init"]) == ("mirror", method, None)
        assert json.loads((out / "stages" / method / exp.MARKER).read_text())["summary"]["step"] == 2
    references = ["MinBERT", "MinBERT-SimCSE", "MinBERT-Mirror"]
    assert [r["name"] for r in objectives["reference"]] == references
    table1 = {r["name"]: r["ours"]["sts_spearman"] for r in json.loads((out / "table1.json").read_text())["rows"]}
    assert [r["ours"]["sts_spearman"] for r in objectives["reference"]] == [table1[n] for n in references]
    md = (out / "objectives.md").read_text()
    assert all(f"| {n} |" in md for n in names) and "| *MinBERT-Mirror* (reference) |" in md
    assert "no numbers for these" in md and "0.736" in md

    before = mtimes(out, OBJECTIVES)
    calls = record_pretrainings(monkeypatch, run=False)
    capsys.readouterr()
    experiments.run(["objectives", "--out-dir", str(out)])
    assert calls == []
    assert mtimes(out, OBJECTIVES) == before
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[1/4] MinBERT-BSL: mirror stage --method bsl from --model")
    assert sum("finished earlier, reused" in line for line in lines) == 4
    assert not any(line.startswith("evaluating") for line in lines)  # the STS results are cached too

    # Without a finished MinBERT-Mirror the table says so instead of showing it.
    (out / "stages" / "mirror" / exp.MARKER).unlink()
    experiments.run(["objectives", "--out-dir", str(out)])
    assert calls == []
    assert [r["name"] for r in json.loads((out / "objectives.json").read_text())["reference"]] == ["MinBERT",
                                                                                                  "MinBERT-SimCSE"]
    assert "MinBERT-Mirror (reference): not trained in this --out-dir yet" in (out / "objectives.md").read_text()


@pytest.mark.slow
def test_objectives_as_published(suite, tmp_path, capsys):
    """objectives --preset published: every method with its paper's preset (no --steps, no
    --max-length: the preset sets them), in directories of their own; the table names the presets."""
    out = tmp_path / "out"
    shutil.copytree(suite[0], out)
    summary = experiments.run(["objectives", "--out-dir", str(out), "--preset", "published", "--dry-run"])
    commands = {t["label"]: t["command"] for t in summary["tasks"]}
    assert list(commands) == ["SimCSE (published)", "Mirror-BERT (published)", "BSL (published)", "CT (published)",
                              "TSDAE (published)", "MinBERT-MLM"]
    assert "--preset mirror-bert" in commands["Mirror-BERT (published)"]
    assert "--steps" not in commands["CT (published)"] and "--steps" in commands["MinBERT-MLM"]
    assert "stages/ct-published" in commands["CT (published)"]
    experiments.run(["objectives", "--out-dir", str(out), "--preset", "published", "--rows",
                      "CT (published),SimCSE (published)"])
    config = json.loads((out / "stages" / "ct-published" / "config.json").read_text())
    assert (config["preset"], config["lr"], config["ct_negatives"]) == ("ct", 1e-5, 7)
    assert config["batch_size"] == 4  # --pretrain-args wins over the preset
    md = (out / "objectives.md").read_text()
    assert "| CT (published) | Contrastive Tension as published (`--preset ct`) |" in md
    assert "at its paper's settings" in md
    assert "| *MinBERT-SimCSE* (reference) |" in md and "| *MinBERT-Mirror* (reference) |" in md
    # The paper's SimCSE against the report's, paired on the same STS dev pairs; the report's claims still there.
    claims = {(c["a"], c["b"]): c for c in json.loads((out / "claims.json").read_text())["claims"]}
    ours = claims[("SimCSE (published)", "MinBERT-SimCSE")]
    assert ours["report_claim"] is False and claims[("BERT-CF", "Mirror-flow")]["report_claim"] is True
    rows = {r["name"]: r["ours"] for r in json.loads((out / "objectives.json").read_text())["rows"]
            + json.loads((out / "objectives.json").read_text())["reference"]}
    difference = rows["SimCSE (published)"]["sts_spearman"]["mean"] - rows["MinBERT-SimCSE"]["sts_spearman"]["mean"]
    assert ours["mean_difference"] == pytest.approx(difference, abs=1e-9)
    assert ("Mirror-BERT (published)", "MinBERT-Mirror") not in claims  # not run in this OUT


@pytest.mark.slow
def test_objectives_rows_filter(tiny_bert_dir, suite_data, tmp_path, capsys):
    out = tmp_path / "out"
    experiments.run(suite_argv("objectives", tiny_bert_dir, suite_data, out, "--rows", "tsdae", "--dry-run"))
    heads = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[")]
    assert [h.split(":")[0] for h in heads] == ["[1/1] MinBERT-TSDAE"]
    assert not out.exists()
    assert experiments.main(suite_argv("objectives", tiny_bert_dir, suite_data, out, "--rows", "MinBERT-Mirror")) == 2
    assert "not a row of objectives (rows: MinBERT-BSL, MinBERT-CT" in capsys.readouterr().err


# ---- fine-tuning ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_row_fine_tuned(tiny_bert_dir, suite_data, tmp_path):
    out = tmp_path / "out"
    argv = suite_argv("all", tiny_bert_dir, suite_data, out, "--rows", "MinBERT", "--finetune-steps-scale",
                      "0.0004", "--eval-every", "2")
    experiments.run(argv)
    row = json.loads((out / "table1.json").read_text())["rows"][0]
    assert row["name"] == "MinBERT"
    for key in ("sst_accuracy", "qqp_accuracy", "sts_pearson", "mean_dev"):
        assert row["ours"][key]["n"] == 1 and math.isfinite(row["ours"][key]["mean"]), key
    metrics = json.loads((out / "finetune" / "minbert" / "metrics.json").read_text())
    assert row["ours"]["qqp_accuracy"]["mean"] == metrics["qqp_acc"]
    assert "| MinBERT |" in (out / "table1.md").read_text()
    assert not (out / "stages").exists()  # the MinBERT row needs no pretraining stage
    qualitative = (out / "qualitative.md").read_text()
    qqp = qualitative[qualitative.index("## QQP dev"):qualitative.index("## SST-5 dev")]
    predictions = [line.rstrip(" |").rsplit("| ", 1)[-1] for line in qqp.splitlines()[4:] if line.startswith("|")]
    assert len(predictions) == 10 and set(predictions) <= {"0", "1"}


@pytest.mark.slow
def test_ablation_rows_fine_tuned(tiny_bert_dir, suite_data, tmp_path, capsys):
    """--finetune-ablations: Mirror-flow and Mirror-whitening fine-tuned as table 1's rows are;
    finetuned.json holds each row's metrics.json values, and the claim between them is tested on the
    fine-tuned columns (one seed: the difference is a − b itself). Without the flag the ablation
    rows are not fine-tuned; with a command that has no ablation rows it is refused in one line."""
    from bertcf.experiments.results import FINETUNED

    out = tmp_path / "out"
    rows = ("--rows", "Mirror-flow,Mirror-whitening", "--finetune-steps-scale", "0.0004", "--eval-every", "2")
    plain = experiments.run(suite_argv("all", tiny_bert_dir, suite_data, tmp_path / "plain", *rows, "--dry-run"))
    assert not [t for t in plain["tasks"] if t["kind"] == "finetune"]
    experiments.run(suite_argv("all", tiny_bert_dir, suite_data, out, *rows, "--finetune-ablations"))
    tuned = json.loads((out / "finetuned.json").read_text())
    assert [r["name"] for r in tuned["rows"]] == ["Mirror-flow", "Mirror-whitening"]
    metrics = {key: json.loads((out / "finetune" / key / "metrics.json").read_text())
               for key in ("mirror-flow", "mirror-whitening")}
    for row, key in zip(tuned["rows"], metrics):
        assert row["ours"]["sts_pearson"]["mean"] == metrics[key]["sts_pearson"]
        assert row["ours"]["mean_dev"]["mean"] == metrics[key]["mean_dev"]
        assert row["report"]["sst_accuracy"] is None  # the report has no fine-tuned ablation rows
        assert row["best_steps"] == [metrics[key]["step"]]
    claims = {c["metric"]: c for c in tuned["claims"]}
    assert set(claims) == set(FINETUNED)
    assert {(c["a"], c["b"]) for c in claims.values()} == {("Mirror-flow", "Mirror-whitening")}
    difference = metrics["mirror-flow"]["qqp_acc"] - metrics["mirror-whitening"]["qqp_acc"]
    assert claims["qqp_accuracy"]["mean_difference"] == pytest.approx(difference)
    text = (out / "finetuned.md").read_text()
    assert "| Mirror-flow |" in text and "## The claims on these columns" in text
    assert "--finetune-ablations" in text  # the command and its settings, under the table
    capsys.readouterr()
    assert experiments.main(suite_argv("table1", tiny_bert_dir, suite_data, tmp_path / "t", "--finetune-ablations")) == 2
    err = capsys.readouterr().err.strip()
    assert "--finetune-ablations" in err and "\n" not in err


# ---- SentEval columns ---------------------------------------------------------------------------------------
def test_senteval_columns_and_per_set_table(tiny_bert_dir, suite_data, tmp_path):
    from bertcf import SentenceEncoder
    from bertcf.evaluation.senteval import evaluate
    senteval = write_senteval(tmp_path / "SentEval")
    out = tmp_path / "out"
    experiments.run(suite_argv("all", tiny_bert_dir, suite_data, out, "--rows", "MinBERT", "--no-finetune",
                                "--senteval-dir", str(senteval), "--transfer"))
    expected = evaluate(SentenceEncoder.from_pretrained(tiny_bert_dir), senteval, "sts,transfer", "fasttest")
    row = json.loads((out / "table1.json").read_text())["rows"][0]
    assert {t: v["mean"] for t, v in row["ours"]["senteval"]["sts"].items()} == pytest.approx(expected["sts"])
    table1 = (out / "table1.md").read_text()
    assert "| 7 STS avg (test) | Transfer avg (fasttest) |" in table1
    assert f"| {expected['sts_avg']:.2f} | {expected['transfer_avg']:.2f} |" in table1
    analysis = (out / "analysis.md").read_text()
    assert "# SentEval STS test sets" in analysis and f"| {expected['sts']['STS14']:.2f} |" in analysis
    # Without the files the tables are as before.
    plain = tmp_path / "plain"
    experiments.run(suite_argv("table1", tiny_bert_dir, suite_data, plain, "--rows", "MinBERT", "--no-finetune"))
    assert "STS avg" not in (plain / "table1.md").read_text()


def write_config(vocab_path, config: Path) -> Path:
    """A config-only directory: the tiny BERT's config.json and a vocab.txt, no weights."""
    from helpers import TINY_BERT_CONFIG

    config.mkdir()
    vocab_size = sum(1 for line in Path(vocab_path).read_text(encoding="utf-8").splitlines() if line)
    (config / "config.json").write_text(json.dumps({**TINY_BERT_CONFIG, "vocab_size": vocab_size}))
    shutil.copy(vocab_path, config / "vocab.txt")
    return config


@pytest.mark.slow
def test_mlm_base_chain_from_a_config(vocab_path, suite_data, tmp_path, monkeypatch, capsys):
    """mlm-base: MLM from a config-only directory (random weights), then table1 and the ablations
    from that MLM encoder, with a row for the untrained random encoder; a second invocation
    reruns nothing."""
    config = write_config(vocab_path, tmp_path / "config")
    out = tmp_path / "out"
    argv = suite_argv("mlm-base", config, suite_data, out, "--config", str(config), "--mlm-steps", "3",
                      "--no-finetune")
    summary = experiments.run(argv)
    base = out / "stages" / "mlm-base"
    assert json.loads((base / exp.MARKER).read_text())["status"] == "done"
    mlm = json.loads((base / "config.json").read_text())
    assert (mlm["method"], mlm["steps"], mlm["batch_size"], mlm["lr_schedule"]) == ("mlm", 3, 4, "linear")
    assert mlm["select_on"] == "mlm-heldout"  # MLM lowers STS at first: STS would keep the random step 0
    assert "mlm_heldout_accuracy = " in (base / "best" / "README.md").read_text()
    assert mlm["model"] == str(config)
    mirror = json.loads((out / "stages" / "mirror" / "config.json").read_text())
    assert mirror["model"] == str((base / "best").resolve())
    names = [r["name"] for r in summary["table1"]["rows"]]
    assert names == ["Random weights", "MinBERT", "MinBERT-SimCSE", "MinBERT-Mirror", "MinBERT-flow",
                     "MinBERT-whitening", "BERT-CF"]
    assert all(r["ours"]["sts_spearman"]["n"] == 1 for r in summary["table1"]["rows"])
    assert [r["name"] for r in summary["ablations"]["rows"]] == ["SimCSE-joint", "MinBERT-joint", "Mirror-flow",
                                                                 "Mirror-whitening"]
    whitened = json.loads((out / "stages" / "minbert-whitening" / "config.json").read_text())
    assert whitened["model"] == str((base / "best").resolve())  # whitening of the MLM base
    assert "Random weights" in (out / "table1.md").read_text() and "mlm-base: MinBERT is the MLM base" in (
        out / "table1.md").read_text()
    calls = record_pretrainings(monkeypatch, run=False)
    capsys.readouterr()
    experiments.run(["mlm-base", "--out-dir", str(out), "--no-finetune"])
    assert calls == []
    assert capsys.readouterr().out.count("finished earlier, reused") == 10
