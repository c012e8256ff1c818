"""The multitask methods in a stage-3 run (bertcf.multitask.methods): --aggregator, --task-weighting
and --smart-weight from the command line and from Python, recorded in config.json, their weights
in TensorBoard, and resumed bit for bit. The methods themselves are tested against torchjd,
LibMTL and smart-pytorch beside this file (test_aggregation.py, test_weighting.py, test_smart.py)."""
from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from helpers import multitask_argv as argv
from helpers import quiet_multitask as quiet
from helpers import write_cs224n_files
from safetensors.torch import load_file

from bertcf import SentenceEncoder, set_seed
from bertcf.multitask import MultitaskTrainer, builtin_tasks

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_cs224n_files(tmp_path_factory.mktemp("mt-methods"))


def last(run_dir) -> dict:
    return {f"{n}/{k}": v for n in ("model.safetensors", "heads.safetensors")
            for k, v in load_file(str(run_dir / "last" / n)).items()}


METHODS = {
    "pcgrad": ["--aggregator", "pcgrad"],
    "mgda": ["--aggregator", "mgda"],
    "uncertainty": ["--task-weighting", "uncertainty"],
    "dwa": ["--task-weighting", "dwa", "--dwa-window", "1"],
    "smart": ["--smart-weight", "1.0"],
    "smart+pcgrad": ["--smart-weight", "1.0", "--aggregator", "pcgrad"],
}


@pytest.mark.parametrize("method", METHODS)
def test_each_method_runs_is_recorded_and_resumes_bit_for_bit(method, tiny_bert_dir, data_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    flags = METHODS[method]
    straight, part, plain = tmp_path / "straight", tmp_path / "part", tmp_path / "plain"
    quiet(argv(tiny_bert_dir, data_dir, straight, 4, *flags))
    quiet(argv(tiny_bert_dir, data_dir, part, 2, *flags))
    quiet(["--resume", "--out-dir", str(part), "--steps", "4"])
    a, b = last(straight), last(part)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    quiet(argv(tiny_bert_dir, data_dir, plain, 4))
    assert any(not torch.equal(a[k], v) for k, v in last(plain).items())  # the method changed the training
    config = json.loads((straight / "config.json").read_text())
    given = dict(zip(flags[::2], flags[1::2]))
    for flag, value in given.items():
        assert str(config[flag[2:].replace("-", "_")]) == value
    scalars = set(EventAccumulator(str(straight / "tb")).Reload().Tags()["scalars"])
    assert {"train/weight_sst", "train/weight_qqp", "train/weight_sts"} <= scalars
    if "--aggregator" in given and given["--aggregator"] == "mgda":
        assert {"train/aggregator_weight_sst", "train/aggregator_weight_qqp"} <= scalars
    if "--smart-weight" in given:
        assert "train/smart" in scalars
    if method == "uncertainty":  # the learned log-variances are saved with the state and move
        state = torch.load(straight / "last" / "training_state.pt", weights_only=False)
        log_var = state["modules"]["weighting"]["log_var"]
        assert log_var.shape == (3,) and log_var.abs().sum() > 0


def test_sum_is_the_default_bit_for_bit(tiny_bert_dir, data_dir, tmp_path):
    quiet(argv(tiny_bert_dir, data_dir, tmp_path / "default", 2))
    quiet(argv(tiny_bert_dir, data_dir, tmp_path / "sum", 2, "--aggregator", "sum", "--task-weighting", "fixed"))
    a, b = last(tmp_path / "default"), last(tmp_path / "sum")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_python_trainer_takes_the_methods_as_keywords(tiny_bert_dir, data_dir, tmp_path):
    quiet(argv(tiny_bert_dir, data_dir, tmp_path / "cli", 2, "--aggregator", "pcgrad", "--task-weighting",
               "uncertainty"))
    set_seed(11711)
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    tasks = builtin_tasks(data_dir, sst_batch_size=4, qqp_batch_size=6, sts_batch_size=4)
    with contextlib.redirect_stdout(io.StringIO()):
        MultitaskTrainer(encoder, list(tasks.values()), steps=2, eval_every=2, log_every=1, proj_dim=16,
                         max_length=24, lr=1e-3, device="cpu", precision="fp32", max_train_examples=10,
                         aggregator="pcgrad", task_weighting="uncertainty", out_dir=str(tmp_path / "python")).fit()
    a, b = last(tmp_path / "cli"), last(tmp_path / "python")
    assert all(torch.equal(a[k], b[k]) for k in a)
