"""Stage-3 runs compared over seeds (bertcf.multitask.compare): the scores are each run's dev
metrics (metrics.json's), the difference is the seeds' mean, and the interval and verdict are
the project's paired bootstrap's on the same predictions."""
from __future__ import annotations

import contextlib
import io
import json

import pytest
from helpers import write_cs224n_files

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
                command.run(["--encoder", str(tiny_bert_dir), "--data-dir", str(data), "--out-dir",
                             str(root / "runs" / f"{label}-seed{seed}"), "--steps", "2", "--eval-every", "2",
                             "--sst-batch-size", "4", "--qqp-batch-size", "6", "--sts-batch-size", "4",
                             "--proj-dim", "16", "--max-length", "24", "--lr", lr, "--seed", str(seed),
                             "--device", "cpu", "--precision", "fp32"])
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
