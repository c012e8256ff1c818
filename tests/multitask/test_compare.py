"""Stage-3 runs compared over seeds (bertcf.multitask.compare): the scores are each run's dev
metrics (metrics.json's), the difference is the seeds' mean, and the interval and verdict are
the project's paired bootstrap's on the same predictions."""
from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
from helpers import multitask_argv, write_cs224n_files

from bertcf.errors import UsageError
from bertcf.evaluation.bootstrap import paired_difference
from bertcf.multitask import command
from bertcf.multitask.compare import compare, dev_predictions, gold_labels, main, markdown, run_tasks

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs_dir(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("mt-compare")
    data = write_cs224n_files(root / "data")
    for label, lr in (("slow", "1e-5"), ("fast", "3e-3")):
        for seed in (1, 2):
            with contextlib.redirect_stdout(io.StringIO()):
                command.run(multitask_argv(tiny_bert_dir, data, root / "runs" / f"{label}-seed{seed}", 2,
                                           log_every=None, lr=lr, max_train_examples=None, seed=seed))
    (root / "runs" / "unfinished-seed1").mkdir()  # no metrics.json: left out
    return root / "runs"


def test_scores_differences_and_verdicts(runs_dir):
    result = compare(runs_dir, "slow")
    assert result["tasks"] == ["sst", "qqp", "sts"] and set(result["scores"]) == {"slow", "fast"}
    for label in ("slow", "fast"):
        for task, key in (("sst", "sst_acc"), ("qqp", "qqp_acc"), ("sts", "sts_pearson")):
            per_seed = [json.loads((runs_dir / f"{label}-seed{s}" / "metrics.json").read_text())[key] for s in (1, 2)]
            assert result["scores"][label][task]["mean"] == pytest.approx(sum(per_seed) / 2, abs=1e-4)
    claims = {c["task"]: c for c in result["claims"]}
    assert set(claims) == {"sst", "qqp", "sts"} and all(c["a"] == "fast" and c["b"] == "slow" for c in claims.values())
    task = run_tasks(runs_dir / "fast-seed1")[2]
    gold = gold_labels(task)
    ids = sorted(gold)
    a = [[dev_predictions(runs_dir / f"fast-seed{s}", task)[i] for i in ids] for s in (1, 2)]
    b = [[dev_predictions(runs_dir / f"slow-seed{s}", task)[i] for i in ids] for s in (1, 2)]
    expected = paired_difference(a, b, [gold[i] for i in ids], "pearson", resamples=2000, seed=0)
    assert claims["sts"]["ci95"] == expected["ci95"] and claims["sts"]["verdict"] == expected["verdict"]
    assert claims["sts"]["mean_difference"] == pytest.approx(
        result["scores"]["fast"]["sts"]["mean"] - result["scores"]["slow"]["sts"]["mean"], abs=1e-9)
    table = markdown(result)
    assert "| fast | slow | sts_pearson |" in table and f"**{claims['sts']['verdict']}**" in table


def test_the_command_writes_both_files_and_refuses_a_missing_baseline(runs_dir, tmp_path, capsys):
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(runs_dir), "--baseline", "slow", "--out", str(tmp_path / "claims")]) == 0
    assert json.loads((tmp_path / "claims.json").read_text())["baseline"] == "slow"
    assert (tmp_path / "claims.md").read_text().startswith("| run |")
    with pytest.raises(SystemExit) as e:  # argparse's own error
        main([str(runs_dir)])
    assert e.value.code == 2
    capsys.readouterr()
    assert main([str(runs_dir), "--baseline", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no finished runs named none-seedN" in err[0]


@pytest.fixture(scope="module")
def single_task_runs(tiny_bert_dir, tmp_path_factory):
    """Joint runs of the three tasks and runs of SST alone and of QQP alone, two seeds each."""
    root = tmp_path_factory.mktemp("mt-single")
    data = write_cs224n_files(root / "data")
    for label, tasks in (("joint", "sst,qqp,sts"), ("sst-alone", "sst"), ("qqp-alone", "qqp")):
        for seed in (1, 2):
            with contextlib.redirect_stdout(io.StringIO()):
                command.run(multitask_argv(tiny_bert_dir, data, root / "runs" / f"{label}-seed{seed}", 2,
                                           log_every=None, lr="3e-3", max_train_examples=None, seed=seed, tasks=tasks,
                                           proj_dim=None if tasks == "sst" else 16))  # SST's head projects nothing
    return root / "runs"


def test_single_task_runs_are_compared_on_their_task_alone(single_task_runs):
    result = compare(single_task_runs, "joint")
    assert set(result["scores"]["sst-alone"]) == {"sst"} and "mean" not in result["scores"]["sst-alone"]
    assert {(c["a"], c["task"]) for c in result["claims"]} == {("sst-alone", "sst"), ("qqp-alone", "qqp")}
    claim = next(c for c in result["claims"] if c["a"] == "sst-alone")
    by_hand = [json.loads((single_task_runs / f"{label}-seed{s}" / "metrics.json").read_text())["sst_acc"]
               for label in ("sst-alone", "joint") for s in (1, 2)]
    assert claim["mean_difference"] == pytest.approx((by_hand[0] + by_hand[1] - by_hand[2] - by_hand[3]) / 2, abs=1e-4)
    row = next(line for line in markdown(result).splitlines() if line.startswith("| sst-alone |"))
    assert row.count("—") == 3  # QQP, STS and the mean: not trained, not made up
    # the other way round: a single-task baseline, the joint run compared on its one task
    assert {c["task"] for c in compare(single_task_runs, "sst-alone", ["joint"])["claims"]} == {"sst"}


def test_a_label_sharing_no_task_with_the_baseline_is_refused(single_task_runs, capsys):
    assert main([str(single_task_runs), "--baseline", "qqp-alone", "--labels", "sst-alone"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sst-alone: its runs trained sst, none of the tasks of --baseline qqp-alone" in err[0]


# ---- runs that cannot be compared as they are: one line, or a note (issue 65) ---------------------------
def copy_runs(source, tmp_path, *leave_out):
    runs = tmp_path / "runs"
    shutil.copytree(source, runs, ignore=shutil.ignore_patterns(*leave_out))
    return runs


@pytest.mark.parametrize("cut, needle", [("mid-line", "line 4: not 'id , prediction'"),
                                         ("whole lines", "has no prediction for id")])
def test_a_truncated_prediction_file_is_one_line(cut, needle, runs_dir, tmp_path, capsys):
    runs = copy_runs(runs_dir, tmp_path, "unfinished-seed1")
    path = runs / "fast-seed2" / "predictions" / "sst-dev-output.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + (lines[3][:5] if cut == "mid-line" else ""))
    assert main([str(runs), "--baseline", "slow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and needle in err[0], err


def test_a_seed_without_metrics_is_left_out_with_a_note(runs_dir, tmp_path, capsys):
    runs = copy_runs(runs_dir, tmp_path)
    (runs / "fast-seed2" / "metrics.json").unlink()  # a seed still running, or stopped
    result = compare(runs, "slow")
    assert "note: left out, no metrics.json (unfinished or stopped): fast-seed2, unfinished-seed1" in \
        capsys.readouterr().err
    assert result["left_out"] == ["fast-seed2", "unfinished-seed1"]
    assert result["scores"]["fast"]["sst"]["seeds"] == [1] and all(c["seeds"] == 1 for c in result["claims"])


def test_seeds_narrows_the_comparison_to_those_runs(runs_dir, tmp_path, capsys):
    """A seed whose predictions are gone (a series that continues on another machine) fails the whole
    comparison; --seeds compares the others, as if that seed had never run."""
    runs = copy_runs(runs_dir, tmp_path, "unfinished-seed1")
    shutil.rmtree(runs / "fast-seed2" / "predictions")
    assert main([str(runs), "--baseline", "slow"]) == 2
    assert "fast-seed2/predictions/sst-dev-output.csv not found" in capsys.readouterr().err
    result = compare(runs, "slow", seeds={1})
    alone = copy_runs(runs_dir, tmp_path / "seed1", "*-seed2", "unfinished-seed1")
    assert result == compare(alone, "slow")
    assert result["scores"]["fast"]["sst"]["seeds"] == [1] and all(c["seeds"] == 1 for c in result["claims"])
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(runs), "--baseline", "slow", "--seeds", "1"]) == 0
    assert main([str(runs), "--baseline", "slow", "--seeds", "one"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seeds one: not comma-separated whole numbers" in err[0]
    # a label whose runs the filter left out: the error names the filter, not only the directory
    assert main([str(runs), "--baseline", "slow", "--seeds", "3,7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no finished runs named slow-seedN in {runs} of --seeds 3,7" in err[0]
    assert main([str(runs), "--baseline", "slow", "--labels", "fast,nope", "--seeds", "1"]) == 2
    assert f"no finished runs named nope-seedN in {runs} of --seeds 1\n" in capsys.readouterr().err


def test_seeds_of_one_label_that_trained_other_tasks_are_refused(single_task_runs, tmp_path):
    runs = copy_runs(single_task_runs, tmp_path)
    shutil.copytree(runs / "sst-alone-seed1", runs / "joint-seed3")
    with pytest.raises(UsageError, match="joint: joint-seed3 trained sst, joint-seed1 qqp, sst, sts"):
        compare(runs, "joint")
