"""One progress convention for every command (issue 59): a bar on a terminal, plain lines with the
time left in a pipe or log file, never tqdm's carriage returns there; and a run without a score
(no evaluator) reports no step number as a score."""
from __future__ import annotations

import re

import pytest
from helpers import write_lines

from bertcf.utils import progress
from bertcf.utils.progress import Progress, mode_of, track


@pytest.fixture
def no_quiet(monkeypatch):
    """Lines from the first mark on (counted work is quiet for its first seconds)."""
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)


def test_counted_work_in_a_log_is_plain_lines_with_the_time_left(no_quiet, capsys):
    for _ in track(range(40), "score qqp-dev", "lines", unit="pair"):
        pass
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and len(lines) == 10, lines  # a line at each tenth
    assert re.fullmatch(r"score qqp-dev: 4/40 pairs \(10%\), [\d,.]+ pairs/s, 0:00:00 elapsed, ~\d:\d\d:\d\d left",
                        lines[0]), lines[0]
    assert lines[-1].startswith("score qqp-dev: 40/40 pairs (100%)") and "left" not in lines[-1]


def test_quick_work_writes_nothing_and_none_shows_nothing(capsys):
    for _ in track(range(40), "encode", True, unit="sentence"):  # auto: lines, stderr not being a terminal
        pass
    for _ in track(range(4), "train", "auto"):  # a run's steps: a line at each tenth, however quick
        pass
    assert len(capsys.readouterr().err.splitlines()) == 4
    with Progress("none", "encode", 5, unit="sentence") as shown:
        shown.advance(5)
    assert capsys.readouterr().err == ""
    assert (mode_of(True), mode_of(False), mode_of(None), mode_of("lines")) == ("auto", "none", "none", "lines")
    with pytest.raises(ValueError, match="progress takes"):
        mode_of("verbose")


def test_bytes_are_counted_in_megabytes(no_quiet, capsys):
    with Progress("lines", "wiki1m_for_simcse.txt", 4 << 20, unit="B") as shown:
        for _ in range(4):
            shown.update(1 << 20)  # tqdm's name, as a downloader calls it
    assert capsys.readouterr().err.splitlines()[-1].startswith("wiki1m_for_simcse.txt: 4.0 MB/4.0 MB (100%), ")


def test_mine_negatives_in_a_pipe_writes_plain_lines(tiny_bert_dir, tmp_path, no_quiet, capsys):
    """The issue's case: ``python -m bertcf.data mine-negatives ... 2>&1 | tee log`` wrote tqdm bars."""
    from bertcf.commands import data as data_command

    nli = write_lines(tmp_path / "nli.tsv", ["premise\thypothesis\tlabel"] + [
        f"a man number {i} plays a guitar\tsomeone {i} plays music\t0" for i in range(30)])
    status = data_command.main(["mine-negatives", "--encoder", str(tiny_bert_dir), "--nli", str(nli), "--out",
                                str(tmp_path / "mined.tsv"), "--range-max", "5", "--device", "cpu"])
    assert status == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    assert re.search(r"^encode: \d+/\d+ sentences \(100%\)", err, re.M), err


def test_a_run_without_a_score_reports_none(tiny_bert_dir, tmp_path, capsys):
    """``Trainer(...).fit()`` without an evaluator returned the step numbers as its first and best
    scores and logged "eval last_step 3.0000"; the latest evaluation is best/, and no score is made up."""
    from bertcf import SentenceEncoder, TrainConfig, Trainer, objectives, set_seed

    set_seed(1)
    objective = objectives.SimCSE(SentenceEncoder.from_pretrained(tiny_bert_dir))
    sentences = [f"sentence number {i} about a dog" for i in range(16)]
    config = TrainConfig(steps=3, batch_size=4, eval_every=3, device="cpu", progress="lines",
                         out_dir=str(tmp_path / "run"))
    summary = Trainer(objective, sentences, config).fit()
    assert summary["first"] is None and summary["best"] is None and summary["best_step"] == 3
    err = capsys.readouterr().err
    assert "last_step" not in err and "no score: best/ is the latest evaluation" in err, err
    assert (tmp_path / "run" / "best").is_dir()
