"""The multitask methods in a stage-3 run (bertcf.multitask.methods): --aggregator, --task-weighting
and --smart-weight from the command line and from Python, recorded in config.json, their loss
weights in TensorBoard against the formulas (and the logged loss against those weights), and
resumed bit for bit. The methods themselves are tested against torchjd, LibMTL and smart-pytorch
beside this file (test_aggregation.py, test_weighting.py, test_smart.py)."""
from __future__ import annotations

import contextlib
import io
import json
import math

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
TASKS = ("sst", "qqp", "sts")


def weights_by_hand(method, logged, step):
    """The loss weights [SST, QQP, STS] that ``method`` gives the step logged as ``step`` (the first is 1),
    by hand from the task losses logged before it; None where they depend on what the run learned."""
    if method == "uncertainty":  # exp(-s_t) / 2 with every s_t at 0 before the first update
        return [0.5, 0.5, 0.5] if step == 1 else None
    if method == "dwa":  # window 1: weights 1 until two steps are done, then 3 softmax(r / 2)
        if step <= 2:
            return [1.0, 1.0, 1.0]
        rates = [logged[f"train/loss_{t}"][step - 1] / logged[f"train/loss_{t}"][step - 2] for t in TASKS]
        exps = [math.exp(r / 2) for r in rates]
        return [3 * x / sum(exps) for x in exps]
    return [5.0, 20.0, 1.0]  # the report's fixed weights, under any aggregator or SMART


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
    events = EventAccumulator(str(straight / "tb")).Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    for step in (1, 2, 3, 4):
        weights = [logged[f"train/weight_{t}"][step] for t in TASKS]
        expected = weights_by_hand(method, logged, step)
        if expected is not None:
            assert weights == pytest.approx(expected, rel=1e-6), step
        # the step's loss is what these weights make of the task losses logged beside them
        total = sum(w * logged[f"train/loss_{t}"][step] for w, t in zip(weights, TASKS))
        if method == "uncertainty":  # Kendall's + s_t / 2, with w_t = exp(-s_t) / 2
            total += sum(-math.log(2 * w) / 2 for w in weights)
        if "--smart-weight" in given:  # + 1.0 x the regulariser
            assert logged["train/smart"][step] > 0
            total += logged["train/smart"][step]
        assert logged["train/loss"][step] == pytest.approx(total, rel=1e-5), step
        if method == "mgda":  # MGDA's weights: the min-norm point of the gradients' convex hull
            mgda = [logged[f"train/aggregator_weight_{t}"][step] for t in TASKS]
            assert min(mgda) >= 0 and sum(mgda) == pytest.approx(1, abs=1e-5), step
    if method == "uncertainty":  # the learned log-variances are saved with the state and move
        state = torch.load(straight / "last" / "training_state.pt", weights_only=False)
        log_var = state["modules"]["weighting"]["log_var"]
        assert log_var.shape == (3,) and log_var.abs().sum() > 0


def test_sum_is_the_default_bit_for_bit(tiny_bert_dir, data_dir, tmp_path):
    quiet(argv(tiny_bert_dir, data_dir, tmp_path / "default", 2))
    quiet(argv(tiny_bert_dir, data_dir, tmp_path / "sum", 2, "--aggregator", "sum", "--task-weighting", "fixed"))
    a, b = last(tmp_path / "default"), last(tmp_path / "sum")
    # bit for bit: any other aggregator goes through torchjd's Jacobian, any other weighting changes the weights
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


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
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
