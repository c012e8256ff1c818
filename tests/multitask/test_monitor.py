"""Stage 3 in TensorBoard (bertcf.multitask.monitor), read back with tensorboard's own reader: per
task the training loss, dev metric and batches; the learning rate; the cosine between the tasks'
gradients on the encoder (against the gradients taken one by one here); the HParams dashboard;
the projector with each classification task's dev sentences labelled by class; the
precision-recall curve of each pair-classification task."""
from __future__ import annotations

import contextlib
import io
import itertools
import json

import pytest
import torch
from helpers import multitask_argv, write_cs224n_files
from test_tasks import nli_entry, write_nli

from bertcf import SentenceEncoder
from bertcf.multitask import MultitaskModel, builtin_tasks, command
from bertcf.multitask.monitor import gradient_cosines, shared_parameters

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def monitored_run(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("mt-monitor")
    data = write_cs224n_files(root / "data")
    write_nli(data / "nli-train.tsv", 18)
    write_nli(data / "nli-dev.tsv", 9, offset=3)
    (root / "tasks.json").write_text(json.dumps([nli_entry(data)]))
    out = root / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        command.run(multitask_argv(tiny_bert_dir, data, out, 4, "--task-file", root / "tasks.json",
                                   "--conflict-every", 2, max_train_examples=None))
    return out


def events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0, "scalars": 0}).Reload()


def test_scalars_per_task_and_the_gradient_conflicts(monitored_run):
    acc = events(monitored_run)
    scalars = set(acc.Tags()["scalars"])
    tasks = ("sst", "qqp", "sts", "nli")
    assert {f"train/loss_{t}" for t in tasks} | {f"train/batches_{t}" for t in tasks} <= scalars
    assert {"eval/sst_acc", "eval/qqp_acc", "eval/sts_pearson", "eval/nli_acc", "eval/mean_dev", "train/lr"} <= scalars
    pairs = {f"conflict/cos_{a}_{b}" for a, b in itertools.combinations(tasks, 2)}
    assert pairs <= scalars
    for tag in pairs:
        values = acc.Scalars(tag)
        assert [e.step for e in values] == [0, 2]  # --conflict-every 2 over 4 steps
        assert all(-1 <= e.value <= 1 for e in values)


def test_hparams_projector_and_pr_curves(monitored_run):
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = events(monitored_run)
    content = acc.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = session.session_start_info.hparams
    assert hparams["lr"].number_value == pytest.approx(1e-3) and hparams["task_sampling"].string_value == "all"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} >= {"eval/mean_dev", "eval/nli_acc", "eval/sst_acc"}
    # precision-recall curves: the binary QQP task, and each class of the three-way task
    curves = set(acc.PluginTagToContent("pr_curves"))
    assert curves == {"pr/qqp_1", "pr/nli_entailment", "pr/nli_neutral", "pr/nli_contradiction"}
    # the projector: SST's dev sentences (12 here), labelled by class
    config = (monitored_run / "tb" / "projector_config.pbtxt").read_text()
    assert 'tensor_name: "sst_dev' in config
    step = json.loads((monitored_run / "metrics.json").read_text())["step"]  # the best checkpoint's
    metadata = (monitored_run / "tb" / f"{step:05d}" / "sst_dev" / "metadata.tsv").read_text().split()
    assert len((monitored_run / "tb" / f"{step:05d}" / "sst_dev" / "tensors.tsv").read_text().splitlines()) == 12
    gold = [int(line.split("\t")[-1]) for line in
            (monitored_run.parent / "data" / "ids-sst-dev.csv").read_text().splitlines()[1:]]
    assert [int(label) for label in metadata] == gold


def test_gradient_cosines_are_the_tasks_gradients_taken_one_by_one(tiny_bert_dir):
    torch.manual_seed(0)
    tasks = list(builtin_tasks().values())
    model = MultitaskModel(SentenceEncoder.from_pretrained(tiny_bert_dir), tasks, proj_dim=8).eval()
    ids = torch.randint(5, 90, (10, 7))
    mask = torch.ones_like(ids)
    out = model(ids, mask, {"sst": 2, "qqp": 2, "sts": 2})
    parts = {"sst": out["sst"].logsumexp(-1).mean(), "qqp": out["qqp"][0].pow(2).mean() - out["qqp"][1].mean(),
             "sts": (out["sts"][0] * out["sts"][1]).sum()}
    params = shared_parameters(model)
    cosines = gradient_cosines(parts, params)
    grads = {}
    for task, loss in parts.items():
        model.zero_grad()
        loss.backward(retain_graph=True)
        grads[task] = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
    for a, b in itertools.combinations(parts, 2):
        expected = grads[a] @ grads[b] / (grads[a].norm() * grads[b].norm())
        assert cosines[f"cos_{a}_{b}"].item() == pytest.approx(expected.item(), abs=1e-5)
