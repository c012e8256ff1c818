"""Each task's dev metric against the step (bertcf.multitask.curves): the curves are the runs'
metrics.jsonl records, drawn into one PNG; a record that is no evaluation is refused in one line."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from bertcf.multitask import curves
from bertcf.multitask.curves import main, read_curves


def fake_run(path, records):
    path.mkdir(parents=True)
    (path / "metrics.json").write_text("{}")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def runs_dir(tmp_path):
    for seed in (1, 2):
        fake_run(tmp_path / f"all-seed{seed}", [
            {"step": 0, "sst_acc": 0.2, "qqp_acc": 0.6, "mean_dev": 0.4, "batches_sst": 0.0},
            {"step": 10, "sst_acc": 0.3 + seed / 100, "qqp_acc": 0.7, "mean_dev": 0.5, "batches_sst": 10.0}])
        fake_run(tmp_path / f"sst-alone-seed{seed}", [{"step": 0, "sst_acc": 0.2}, {"step": 10, "sst_acc": 0.4}])
    return tmp_path


def test_the_curves_are_the_evaluation_records(runs_dir):
    assert read_curves(runs_dir / "all-seed2") == {"sst_acc": [(0, 0.2), (10, 0.32)], "qqp_acc": [(0, 0.6), (10, 0.7)]}


def test_the_command_draws_one_panel_per_metric(runs_dir, tmp_path, capsys):
    out = tmp_path / "out" / "curves.png"
    assert main([str(runs_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    with Image.open(out) as image:  # two panels (qqp_acc, sst_acc) side by side
        assert image.format == "PNG" and image.size[0] > 1.8 * image.size[1]
    assert main([str(runs_dir), "--out", str(tmp_path / "one.png"), "--labels", "sst-alone"]) == 0
    with Image.open(tmp_path / "one.png") as image:  # one panel: sst_acc alone
        assert image.size[0] < 1.5 * image.size[1]


def test_seeds_draws_those_runs_alone(runs_dir, tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(curves, "read_curves", lambda path: drawn.append(path.name) or read_curves(path))
    assert main([str(runs_dir), "--out", str(tmp_path / "c.png"), "--seeds", "2"]) == 0
    assert sorted(drawn) == ["all-seed2", "sst-alone-seed2"]


@pytest.mark.parametrize("line", ["not json", '{"sst_acc": 0.3}', "[1, 2]", '{"step": 1, "sst_acc": [0.1, 0.2]}'])
def test_a_record_that_is_no_evaluation_is_refused(runs_dir, tmp_path, capsys, line):
    (runs_dir / "all-seed1" / "metrics.jsonl").write_text('{"step": 0, "sst_acc": 0.2}\n' + line + "\n")
    assert main([str(runs_dir), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "all-seed1/metrics.jsonl, line 2: not an evaluation record (a JSON object with a step and numbers)" in err[0]
    assert not (tmp_path / "c.png").exists()


def test_unknown_labels_and_empty_directories_are_refused(runs_dir, tmp_path, capsys):
    assert main([str(runs_dir), "--out", str(tmp_path / "c.png"), "--labels", "nope"]) == 2
    assert "no finished runs named nope-seedN" in capsys.readouterr().err
    assert main([str(tmp_path / "out-empty"), "--out", str(tmp_path / "c.png")]) == 2
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "c.png")]) == 2
    assert "no finished runs named LABEL-seedN" in capsys.readouterr().err
    assert main([str(runs_dir), "--out", str(tmp_path / "c.png"), "--seeds", "9"]) == 2
    assert f"no finished runs named LABEL-seedN in {runs_dir} of --seeds 9" in capsys.readouterr().err
