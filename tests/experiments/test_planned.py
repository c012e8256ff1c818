"""The experiments' settings resolved once: the command's options are a frozen object that nothing
changes after parsing, and each planned pretraining is built from the plan's typed settings (its
row's flags and --pretrain-args, given as words, parsed once), resolving to what the command line
it shows and records resolves to."""
from __future__ import annotations

import dataclasses
import json

import pytest

from bertcf.config import pretrain
from bertcf.errors import UsageError
from bertcf.experiments.options import parse_args
from bertcf.experiments.plan import Plan
from bertcf.experiments.planned import pretraining_config


def test_the_options_are_resolved_once_and_then_only_read(tmp_path):
    options = parse_args(["mlm-base", "--config", "cfg", "--out-dir", str(tmp_path), "--nli", "a.jsonl, b.jsonl",
                          "--pretrain-args", "--batch-size 4 --log-every 1"])
    assert options.model == str((tmp_path / "stages" / "mlm-base" / "best").resolve())  # the MLM base's best/
    assert options.nli_list == ["a.jsonl", "b.jsonl"] and options.pretrain_args_list == ["--batch-size", "4",
                                                                                         "--log-every", "1"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.model = "bert-base-uncased"
    with pytest.raises(UsageError, match="--pretrain-args: No closing quotation"):
        parse_args(["all", "--out-dir", str(tmp_path), "--pretrain-args", "--corpus 'a"])


def test_a_pretraining_is_built_from_the_plans_settings_as_its_command_line_resolves(tiny_bert_dir, tmp_path,
                                                                                     capsys):
    options = parse_args(["ablations", "--model", str(tiny_bert_dir), "--data-dir", str(tmp_path / "data"),
                          "--out-dir", str(tmp_path / "out"), "--corpus-from-tasks", "--steps-scale", "0.001",
                          "--eval-every", "5", "--device", "cpu", "--pretrain-args", "--batch-size 4 --log-every 1"])
    tasks = [t for t in Plan(options).runs() if t.kind == "pretraining"]
    assert {t.values["stage"] for t in tasks} == {"mirror", "joint", "flow", "whiten"}
    for task in tasks:
        config = pretraining_config(task)
        assert config == pretrain.parse(task.argv), task.label
        assert (config.batch_size, config.log_every, config.corpus_from_tasks) == (4, 1, True)
    minbert_joint = next(t for t in tasks if t.dir.name == "minbert-joint")
    assert pretraining_config(minbert_joint).unfreeze_encoder  # the row's own flag, given as a word
    minbert_joint.dir.mkdir(parents=True)
    (minbert_joint.dir / "config.json").write_text(json.dumps(pretrain.parse(minbert_joint.argv).to_dict()))
    resumed = pretraining_config(minbert_joint, resume=True)
    assert resumed.resume and resumed == pretrain.parse(minbert_joint.argv + ["--resume"])
