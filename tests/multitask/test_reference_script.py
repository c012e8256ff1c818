"""The independent fine-tunes stage 3 is measured against (docs/results/cpu-minilm-converged/
reference.py): each writes a run directory that ``bertcf.multitask.compare`` and ``curves`` read
as they read stage 3's, its metric the one its predictions give."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_cs224n_files

from bertcf.multitask.compare import compare, gold_labels, run_tasks
from bertcf.multitask.curves import read_curves
from bertcf.multitask.evaluation import read_predictions, task_metric

pytest.importorskip("accelerate", reason="the references need accelerate: pip install -e '.[references]'")
SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "results" / "cpu-minilm-converged" / "reference.py"
pytestmark = pytest.mark.slow


#: ``python SCRIPT ARGV`` for each ARGV in turn, in one process (sys.path[0] the script's folder, the script run
#: as ``__main__``): most of a run's time is importing transformers, datasets and sentence-transformers, which
#: a process per run pays again.
RUN_EACH = ("import json, os, runpy, sys\n"
            "script, argvs = sys.argv[1], json.loads(sys.argv[2])\n"
            "sys.path[0] = os.path.dirname(script)\n"
            "for argv in argvs:\n"
            "    sys.argv = [script, *argv]\n"
            "    runpy.run_path(script, run_name='__main__')\n")


@pytest.fixture(scope="module")
def runs(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("references")
    data = write_cs224n_files(root / "data")
    argvs = [["--task", task, "--model", str(tiny_bert_dir), "--data-dir", str(data), "--out",
              str(root / "runs" / f"ref-{task}-seed1"), "--seed", "1", "--steps", "2", "--eval-every", "1",
              "--max-eval-examples", "6", "--lr", "1e-3", "--max-length", "24"] for task in ("sst", "qqp", "sts")]
    proc = subprocess.run([sys.executable, "-c", RUN_EACH, str(SCRIPT), json.dumps(argvs)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return root / "runs"


@pytest.mark.parametrize("task, key", [("sst", "sst_acc"), ("qqp", "qqp_acc"), ("sts", "sts_pearson")])
def test_a_reference_run_reads_as_a_stage3_run(runs, task, key):
    run = runs / f"ref-{task}-seed1"
    [declared] = run_tasks(run)
    assert declared.name == task
    gold = gold_labels(declared)
    predicted = read_predictions(run / "predictions" / f"{'para' if task == 'qqp' else task}-dev-output.csv", declared)
    assert sorted(predicted) == sorted(gold)  # every dev row, once
    ids = sorted(gold)
    by_hand = task_metric(declared, [predicted[i] for i in ids], [gold[i] for i in ids])
    # metrics.json scores the unrounded predictions; the files hold scores to 4 decimals
    assert json.loads((run / "metrics.json").read_text())[key] == pytest.approx(by_hand, abs=1e-4)
    assert [step for step, _ in read_curves(run)[key]] == [0, 1, 2]  # at the start, then every step


def test_compare_reads_a_reference_as_a_baseline(runs):
    result = compare(runs, "ref-sst", ["ref-sst"])
    assert result["claims"] == [] and set(result["scores"]["ref-sst"]) == {"sst", "mean"}
