"""The experiments' fine-tuning flags (issue 65): --finetune-args checked as run_multitask.py will
take them (its parser, its settings, the tasks they declare, the methods on them) by the dry run,
which then exits with status 2, and by the real run before any pretraining starts; flags that would
send every row's fine-tuning into one directory, or give every seed one seed, refused."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import write_cs224n_files

from bertcf.commands import experiments


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    data = write_cs224n_files(tmp_path_factory.mktemp("ft-args") / "data")
    (data.parent / "corpus.txt").write_text("the man is playing a guitar .\na dog runs on the beach .\n")
    return data


def suite(bert, data: Path, out: Path, finetune_args: str, *more) -> list[str]:
    """The ablations' Mirror-flow row, fine-tuned too: one pretraining chain and one fine-tuning."""
    return ["ablations", "--model", str(bert), "--data-dir", str(data), "--out-dir", str(out),
            "--corpus", str(data.parent / "corpus.txt"), "--device", "cpu", "--rows", "Mirror-flow",
            "--finetune-ablations", "--finetune-args", finetune_args, *more]


@pytest.mark.parametrize("words, needle", [
    ("--aggregator pcgrad --task-sampling proportional", "it needs --task-sampling all, not proportional"),
    ("--task-file {missing}", "missing.yaml not found"),
    ("--bogus 3", "unrecognized arguments: --bogus 3"),
    ("--out-dir runs/one", "--finetune-args: --out-dir is set by the plan for each row and seed"),
    ("--seed 5", "--finetune-args: --seed is set by the plan"),
    ("--aggregator pcgrad --freeze-encoder", "which --freeze-encoder freezes"),
])
def test_a_dry_run_checks_the_finetuning_flags_and_exits_2(words, needle, tiny_bert_dir, inputs, tmp_path, capsys):
    out = tmp_path / "out"
    words = words.format(missing=tmp_path / "missing.yaml")
    assert experiments.main(suite(tiny_bert_dir, inputs, out, words, "--dry-run")) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, captured.err
    assert "multitask fine-tuning of stages/mirror-flow" in err[0] and needle in err[0], err[0]
    assert "[3/3] Mirror-flow" in captured.out  # the plan is printed first, the problem listed under it
    assert not out.exists()


def test_good_finetuning_flags_pass_the_dry_run(tiny_bert_dir, inputs, tmp_path, capsys):
    out = tmp_path / "out"
    assert experiments.main(suite(tiny_bert_dir, inputs, out, "--aggregator pcgrad --qqp-weight 10", "--dry-run")) == 0
    assert "missing before this can run" not in capsys.readouterr().out and not out.exists()


def test_the_real_run_refuses_them_before_any_pretraining(tiny_bert_dir, inputs, tmp_path, capsys):
    out = tmp_path / "out"
    assert experiments.main(suite(tiny_bert_dir, inputs, out, "--bogus 3")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments: --bogus 3" in err[0]
    assert not out.exists()  # no stage trained, no suite.json written
