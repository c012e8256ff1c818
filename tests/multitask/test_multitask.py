"""Multitask fine-tuning (bertcf.multitask, run_multitask.py) on the CPU with the report's three
tasks: the losses and the prediction rules against values computed by hand, the per-task batch
cycling, and tiny end-to-end runs (tiny random BERT, a few rows of every CS224N file): prediction
files, metrics.json, --predict-only, resume bit-identity, a flow checkpoint, bad input; and the
same for --pair-encoding cross (the pairs encoded jointly). Declared tasks, sampling, monitoring
and the weights from before the move: tests/multitask/test_tasks.py and the files beside it."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from helpers import REPO, multitask_argv
from helpers import quiet_multitask as run_quiet
from helpers import torchrun, write_cs224n_files
from safetensors.torch import load_file

from bertcf.cli import run_main
from bertcf.data.tasks import read_qqp, read_sst, read_sts
from bertcf.evaluation.bootstrap import interval
from bertcf.evaluation.metrics import pearson
from bertcf.multitask import command
from bertcf.multitask import evaluation as mtm_metrics
from bertcf.multitask import losses
from bertcf.multitask import model as mtm
from bertcf.multitask import trainer as mt
from bertcf.multitask.data import TaskData, load_task
from bertcf.multitask.heads import Widths, build_head
from bertcf.multitask.tasks import builtin_tasks
from bertcf.runs import resolve_encoder_path
from bertcf.models.cross_encoder import pad_pairs
from bertcf.models.encoder import SentenceEncoder
from bertcf.models.flow import Glow
from bertcf.training.sampler import EpochSampler
from minbert import pad_batch

PREDICTION_FILES = [f"{t}-{s}-output.csv" for t in ("sst", "para", "sts") for s in ("dev", "test")]  # CS224N's names
INPUT_FILES = {"sst": ("ids-sst-dev.csv", "ids-sst-test-student.csv", read_sst),
               "qqp": ("quora-dev.csv", "quora-test-student.csv", read_qqp),
               "sts": ("sts-dev.csv", "sts-test-student.csv", read_sts)}


T = builtin_tasks()  # the report's SST, QQP and STS declarations

#: conftest's one_thread: tiny models on 2 shared cores, where intra-op threads only add spin-waiting (x50 slower).
pytestmark = pytest.mark.usefixtures("one_thread")


# ---- losses by hand ---------------------------------------------------------------------------------
R = 1 / math.sqrt(2)  # cos of [1, 0] and [1, 1]


def test_classification_loss_is_cross_entropy():
    logits = torch.tensor([[2.0, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    labels = torch.tensor([0, 3])
    expected = (-math.log(math.exp(2) / (math.exp(2) + 4)) + math.log(5)) / 2
    assert losses.ClassificationLoss()(logits, labels).item() == pytest.approx(expected, abs=1e-6)


def test_hinge_cosine_loss_by_hand():
    p1 = torch.tensor([[1.0, 0], [1.0, 0], [1.0, 0], [1.0, 0], [2.0, 0]])
    p2 = torch.tensor([[3.0, 0], [0, 1.0], [1.0, 1.0], [0, 1.0], [-1.0, 0]], requires_grad=True)
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0])
    # cos: 1, 0, 0.7071, 0, -1 -> y = max(cos, 0.7): 1, 0.7, 0.7071, 0.7, 0.7
    # duplicates 1 - y: 0.3 (row 1, clamped), 1 - 0.7071 (row 2); non-duplicates y - h: 0.3, 0, 0
    expected = (0.3 + 0.3 + (1 - R) + 0 + 0) / 5
    loss = losses.HingeCosineLoss(margin=0.7)(p1, p2, labels)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    # The clamp: rows whose cosine is below h get no gradient (rows 1, 3, 4).
    assert p2.grad[[1, 3, 4]].abs().max() == 0
    assert p2.grad[[0, 2]].abs().max() > 0


def test_hinge_cosine_loss_margin_is_a_parameter():
    p1, p2 = torch.tensor([[1.0, 0]]), torch.tensor([[1.0, 1.0]])
    assert losses.HingeCosineLoss(0.0)(p1, p2, torch.tensor([0.0])).item() == pytest.approx(R, abs=1e-6)
    assert losses.HingeCosineLoss(0.9)(p1, p2, torch.tensor([0.0])).item() == pytest.approx(0.0, abs=1e-7)
    assert losses.HingeCosineLoss(0.9)(p1, p2, torch.tensor([1.0])).item() == pytest.approx(0.1, abs=1e-6)


def test_cosine_regression_loss_by_hand():
    p1 = torch.tensor([[1.0, 0], [1.0, 0], [1.0, 0], [1.0, 0]])
    p2 = torch.tensor([[-1.0, 0], [5.0, 0], [1.0, 1.0], [0, 2.0]])
    scores = torch.tensor([0.0, 5.0, 2.5, 4.0])
    # h = 0: y = 0 (cos -1 clamped), 1, 0.7071, 0; targets = scores / 5 = 0, 1, 0.5, 0.8
    expected = (0 + 0 + (R - 0.5) ** 2 + 0.8 ** 2) / 4
    assert losses.CosineRegressionLoss()(p1, p2, scores).item() == pytest.approx(expected, abs=1e-6)
    # h = 0.5: y = 0.5, 1, 0.7071, 0.5; targets = 0.5 + 0.5 * scores / 5 = 0.5, 1, 0.75, 0.9
    expected = (0 + 0 + (R - 0.75) ** 2 + 0.4 ** 2) / 4
    assert losses.CosineRegressionLoss(0.5)(p1, p2, scores).item() == pytest.approx(expected, abs=1e-6)


def test_label_scaling():
    assert losses.scale_scores(torch.tensor([0.0, 2.5, 5.0]), 0.0).tolist() == pytest.approx([0, 0.5, 1])
    assert losses.scale_scores(torch.tensor([0.0, 2.5, 5.0]), 0.6).tolist() == pytest.approx([0.6, 0.8, 1])


# ---- prediction rules and metrics ---------------------------------------------------------------
def predict(task, y, pair_encoding="bi"):
    """The predictions of ``task``'s head (``TaskHead.predictions``) from its raw outputs ``y``."""
    return build_head(task, Widths(8, 8, 4), pair_encoding).predictions(y)


def test_prediction_rules():
    assert predict(T["sst"], torch.tensor([[0.1, 3, 0, 0, 0], [0, 0, 0, 0, 9.0]])).tolist() == [1, 4]
    # duplicate when y >= (1 + h) / 2 = 0.85
    y = torch.tensor([0.85, 0.8499, 0.7, 1.0])
    assert predict(T["qqp"], y).tolist() == [1, 0, 0, 1]
    assert predict(T["qqp"].replace(margin=0.0), torch.tensor([0.5, 0.49])).tolist() == [1, 0]
    # STS: y rescaled from [h, 1] to [0, 5]
    assert predict(T["sts"].replace(margin=0.7), torch.tensor([0.7, 1.0, 0.85])).tolist() == pytest.approx([0, 5, 2.5])
    assert predict(T["sts"], torch.tensor([0.0, 0.2, 1.0])).tolist() == pytest.approx([0, 1, 5])
    # another range: y rescaled from [h, 1] to [1, 3]
    ranged = T["sts"].replace(label_range=(1.0, 3.0))
    assert predict(ranged, torch.tensor([0.0, 0.5, 1.0])).tolist() == pytest.approx([1, 2, 3])


def test_metrics_on_known_inputs():
    assert mtm_metrics.task_metric(T["sst"], [1, 2, 3, 4], [1, 2, 0, 0]) == pytest.approx(0.5)
    assert mtm_metrics.task_metric(T["qqp"], [1, 0, 1], [1.0, 0.0, 0.0]) == pytest.approx(2 / 3)
    assert mtm_metrics.task_metric(T["sts"], [0.0, 1.0, 2.0], [1.0, 3.0, 5.0]) == pytest.approx(1.0)
    assert mtm_metrics.task_metric(T["sts"], [2.0, 1.0, 0.0], [1.0, 3.0, 5.0]) == pytest.approx(-1.0)
    # r of [1, 2, 3] and [1, 3, 2] is 0.5
    assert mtm_metrics.task_metric(T["sts"], [1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == pytest.approx(0.5)
    assert mtm_metrics.task_metric(T["sts"], [2.5, 2.5, 2.5], [1.0, 3.0, 5.0]) == 0.0  # constant: 0, not NaN
    assert mtm_metrics.mean_dev({"sst_acc": 0.5, "qqp_acc": 0.8, "sts_pearson": 0.2}, list(T.values())) == pytest.approx(0.5)


# ---- per-task batch cycling -------------------------------------------------------------------------
def test_small_task_wraps_around_within_a_batch():
    sampler = mt.make_samplers({"sst": 5}, seed=1)["sst"]
    batch = sampler.next(8)
    assert len(batch) == 8 and set(batch) == set(range(5))  # a full epoch, then 3 of the next
    assert sorted(batch[:5]) == list(range(5))
    assert sampler.state_dict() == {"epoch": 1, "position": 3}


def test_tasks_cycle_independently():
    sizes = {"sst": 5, "qqp": 11, "sts": 7}
    a, b = mt.make_samplers(sizes, seed=3), mt.make_samplers(sizes, seed=3)
    for _ in range(4):  # draw a lot from one task of `a` only
        a["sst"].next(32)
    for task in ("qqp", "sts"):
        assert a[task].next(9) == b[task].next(9)
    # Different seeds per task: the orders of equal-sized tasks differ.
    c = mt.make_samplers({"sst": 50, "qqp": 50, "sts": 50}, seed=3)
    assert c["sst"].next(50) != c["qqp"].next(50)


def test_train_batch_pads_and_wraps():
    sts = TaskData(T["sts"], [f"id{i}" for i in range(3)],
                      ([[2, 5, 3], [2, 6, 7, 8, 3], [2, 3]], [[2, 9, 3], [2, 3], [2, 4, 4, 3]]), [0.0, 2.5, 5.0])
    sst = TaskData(T["sst"], ["a", "b"], ([[2, 7, 7, 7, 7, 7, 3], [2, 8, 3]],), [4, 1])
    rows = {"sst": [1, 0], "sts": EpochSampler(len(sts), seed=0).next(4)}  # 4 of 3 rows: wraps around
    heads = {t: build_head(T[t], Widths(8, 8, 4)) for t in ("sst", "sts")}
    inputs, labels = mt.train_batch({"sst": sst, "sts": sts}, rows, pad_token_id=0, device="cpu",
                                    label_tensors={"sst": heads["sst"].label_tensor(sst.labels),
                                                   "sts": heads["sts"].label_tensor(sts.labels)})
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    # One batch, task by task and column by column: SST, then STS first and second sentences.
    expected = [sst.tokens[0][r] for r in rows["sst"]] + [sts.tokens[c][r] for c in (0, 1) for r in rows["sts"]]
    assert ids.shape == (len(expected), 7) and mask.shape == ids.shape
    for k, tokens in enumerate(expected):
        assert ids[k, :mask[k].sum()].tolist() == tokens and not ids[k, mask[k].sum():].any()
    assert inputs["sizes"] == {"sst": 2, "sts": 4} and inputs["num_tokens"] == sum(map(len, expected))
    assert labels["sst"].tolist() == [1, 4] and labels["sst"].dtype == torch.long
    assert labels["sts"].tolist() == [sts.labels[r] for r in rows["sts"]] and labels["sts"].dtype == torch.float32


def test_one_pass_forward_equals_each_task_on_its_own(tiny_bert_dir):
    """MultitaskModel.forward encodes every task's sentences in one pass; without dropout that
    equals encoding each task's batch (padded on its own) and applying its head."""
    torch.manual_seed(0)
    model = mtm.MultitaskModel(SentenceEncoder.from_pretrained(tiny_bert_dir), list(T.values()), proj_dim=8).eval()
    g = torch.Generator().manual_seed(1)
    lists = {task: [[2] + torch.randint(5, 90, (int(n),), generator=g).tolist() + [3]
                    for n in torch.randint(1, 12, (rows,), generator=g)]
             for task, rows in (("sst", 3), ("qqp", 4), ("sts", 2))}
    sizes = {"sst": 3, "qqp": 2, "sts": 1}
    ids, mask = pad_batch([t for task in T for t in lists[task]], 0)
    out = model(ids, mask, sizes, num_tokens=int(mask.sum()))

    def alone(task):
        ids, mask = pad_batch(lists[task], 0)
        return model.heads[task].project(model.encoder(ids, mask))  # dropout + linear on every sentence

    torch.testing.assert_close(out["sst"], alone("sst"), rtol=1e-5, atol=1e-6)
    for task in ("qqp", "sts"):
        torch.testing.assert_close(torch.cat(out[task]), alone(task), rtol=1e-5, atol=1e-6)
        assert out[task][0].shape == (sizes[task], 8)

    # Each task's loss (its head's) is the report's on those outputs.
    labels = {"sst": torch.tensor([0, 4, 2]), "qqp": torch.tensor([1.0, 0.0]), "sts": torch.tensor([3.5])}
    expected = {"sst": losses.ClassificationLoss()(out["sst"], labels["sst"]),
                "qqp": losses.HingeCosineLoss(0.7)(*out["qqp"], labels["qqp"]),
                "sts": losses.CosineRegressionLoss(0.0)(*out["sts"], labels["sts"])}
    for task, y in out.items():
        loss = model.heads[task].loss(y, labels[task])
        assert torch.equal(loss, expected[task]), task


# ---- end to end ------------------------------------------------------------------------------------
def argv(bert_dir, data_dir, out_dir, steps=4, **flags) -> list[str]:
    """multitask_argv with this file's settings: batches of 8, 12 and 8 rows from every training row (24), at
    the report's --lr unless ``flags`` say otherwise (``lr=1e-3``, ``max_train_examples=10``)."""
    settings = {"sst_batch_size": 8, "qqp_batch_size": 12, "sts_batch_size": 8, "lr": None, "max_train_examples": None}
    return multitask_argv(bert_dir, data_dir, out_dir, steps, **settings | {k.replace("-", "_"): v
                                                                            for k, v in flags.items()})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_cs224n_files(tmp_path_factory.mktemp("mt-data"))


@pytest.fixture(scope="module")
def straight_run(tiny_bert_dir, data_dir, tmp_path_factory) -> Path:
    """4 steps uninterrupted, default batch sizes larger than the 24 training rows (the QQP one is
    96 pairs, wrapping every step)."""
    out = tmp_path_factory.mktemp("mt-run") / "run"
    run_quiet(argv(tiny_bert_dir, data_dir, out, **{"sst-batch-size": 32, "qqp-batch-size": 96,
                                                     "sts-batch-size": 32, "proj-dim": 768}))
    return out


def read_predictions(path: Path) -> tuple[str, list[str], list[str]]:
    lines = path.read_text().splitlines()
    ids, values = [], []
    for line in lines[1:]:
        i, v = line.split(" , ")
        ids.append(i)
        values.append(v.strip())
    return lines[0], ids, values


def test_run_writes_every_prediction_file_once_per_id(straight_run, data_dir):
    out = straight_run
    for name in ("config.json", "metrics.jsonl", "metrics.json", "best/heads.safetensors", "best/model.safetensors",
                 "best/multitask.json", "last/training_state.pt", "last/heads.safetensors"):
        assert (out / name).is_file(), name
    assert sorted(p.name for p in (out / "predictions").iterdir()) == sorted(PREDICTION_FILES)
    for task, (dev, test, reader) in INPUT_FILES.items():
        for split, name in (("dev", dev), ("test", test)):
            header, ids, values = read_predictions(out / "predictions" / mtm_metrics.prediction_file(task, split))
            assert header == f"id \t {mtm_metrics.PREDICTION_HEADERS[task]} "
            assert ids == [r.id for r in reader(data_dir / name, labeled=False)]
            assert len(set(ids)) == len(ids)
            numbers = [float(v) for v in values]
            if task == "sst":
                assert set(numbers) <= {0, 1, 2, 3, 4}
            elif task == "qqp":
                assert set(numbers) <= {0, 1}
            else:
                assert all(0 <= v <= 5 for v in numbers)
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) >= {"sst_acc", "qqp_acc", "sts_pearson", "mean_dev", "step", "checkpoint"}
    assert metrics["mean_dev"] == pytest.approx((metrics["sst_acc"] + metrics["qqp_acc"] + metrics["sts_pearson"]) / 3)
    # The dev metrics in metrics.json agree with the prediction files.
    gold = {r.id: r.label for r in read_sst(data_dir / "ids-sst-dev.csv")}
    _, ids, values = read_predictions(out / "predictions" / "sst-dev-output.csv")
    assert metrics["sst_acc"] == pytest.approx(sum(gold[i] == int(v) for i, v in zip(ids, values)) / len(ids))
    # Each dev metric's bootstrap interval, over the same rows (bertcf.evaluation.bootstrap's own tests check the method).
    assert metrics["sst_acc_ci95"] == interval([int(v) for v in values], [gold[i] for i in ids], "accuracy")
    for name in ("sst_acc", "qqp_acc", "sts_pearson"):
        lo, hi = metrics[f"{name}_ci95"]
        assert lo <= metrics[name] <= hi and lo < hi, name
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [0, 2, 4]
    best = max(lines, key=lambda l: l["mean_dev"])
    assert metrics["step"] == best["step"]
    assert metrics["mean_dev"] == pytest.approx(best["mean_dev"], abs=1e-6)  # same rows, same model
    config = json.loads((out / "config.json").read_text())
    assert config["qqp_batch_size"] == 96 and config["lr"] == 1e-5 and config["sst_weight"] == 5.0


def test_tensorboard_logs_the_weighted_loss_and_the_dev_metrics(straight_run):
    """What TensorBoard shows against what it is made of: at every step train/loss is the report's sum of the
    task losses logged beside it, weighted 5 (SST), 20 (QQP) and 1 (STS), at the constant default --lr; at
    every evaluation the eval/ values are metrics.jsonl's, eval/mean_dev the mean of the three metrics."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(straight_run / "tb")).Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    assert sorted(logged["train/loss"]) == [1, 2, 3, 4]  # --log-every 1
    for step, loss in logged["train/loss"].items():
        sst, qqp, sts = (logged[f"train/loss_{t}"][step] for t in ("sst", "qqp", "sts"))
        assert loss == pytest.approx(5 * sst + 20 * qqp + sts, rel=1e-6), step  # float32 in TensorBoard
        assert logged["train/lr"][step] == pytest.approx(1e-5), step
    records = [json.loads(line) for line in (straight_run / "metrics.jsonl").read_text().splitlines()]
    assert sorted(logged["eval/mean_dev"]) == [r["step"] for r in records] == [0, 2, 4]
    for record in records:
        step = record["step"]
        for name in ("sst_acc", "qqp_acc", "sts_pearson", "mean_dev"):
            assert logged[f"eval/{name}"][step] == pytest.approx(record[name], rel=1e-6, abs=1e-7), (name, step)
        mean = (logged["eval/sst_acc"][step] + logged["eval/qqp_acc"][step] + logged["eval/sts_pearson"][step]) / 3
        assert logged["eval/mean_dev"][step] == pytest.approx(mean, rel=1e-6, abs=1e-7), step


def test_best_checkpoint_rebuilds_the_model(straight_run):
    model = mtm.MultitaskModel.from_pretrained(straight_run)  # a run directory stands for its best/
    assert model.proj_dim == 768 and model.tasks["qqp"].margin == 0.7 and model.tasks["sts"].margin == 0.0
    assert list(model.tasks) == ["sst", "qqp", "sts"] and model.tasks["sst"].num_classes == 5
    heads = load_file(str(straight_run / "best" / "heads.safetensors"))
    assert set(heads) == set(model.heads_state_dict())
    assert heads["sst_head.1.weight"].shape == (5, model.encoder.dim)
    assert heads["qqp_head.1.weight"].shape == (768, model.encoder.dim)
    # The encoder part is a plain sentence encoder checkpoint too.
    assert SentenceEncoder.from_pretrained(straight_run / "best").dim == model.encoder.dim


def test_predict_only_reproduces_the_files(straight_run, tmp_path):
    # into another directory (settings from the run's config.json)
    run_quiet(["--predict-only", "--checkpoint", str(straight_run), "--out-dir", str(tmp_path / "again"),
               "--device", "cpu"])
    for name in PREDICTION_FILES:
        assert (tmp_path / "again" / "predictions" / name).read_bytes() == \
            (straight_run / "predictions" / name).read_bytes(), name
    assert json.loads((tmp_path / "again" / "metrics.json").read_text()) == \
        json.loads((straight_run / "metrics.json").read_text())
    # in place, from a copy of the run (its predictions removed first)
    copy = tmp_path / "copy"
    shutil.copytree(straight_run, copy)
    shutil.rmtree(copy / "predictions")
    (copy / "metrics.json").unlink()
    run_quiet(["--predict-only", "--checkpoint", str(copy / "best"), "--device", "cpu"])
    for name in PREDICTION_FILES:
        assert (copy / "predictions" / name).read_bytes() == (straight_run / "predictions" / name).read_bytes()
    (copy / "config.json").write_text('{"sst_train": ')  # damaged: one line naming it, no traceback
    assert run_main(command.run, ["--predict-only", "--checkpoint", str(copy), "--device", "cpu"]) == 2


def test_missing_test_file_is_skipped_and_frozen_encoder_stays(tiny_bert_dir, data_dir, tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level("WARNING", logger="bertcf.multitask"):
        run_quiet(argv(tiny_bert_dir, data_dir, out, steps=2, freeze_encoder=True,
                       qqp_test=tmp_path / "absent.csv"))
    assert "absent.csv" in caplog.text
    names = sorted(p.name for p in (out / "predictions").iterdir())
    assert names == sorted(n for n in PREDICTION_FILES if n != "para-test-output.csv")
    before, after = load_file(str(tiny_bert_dir / "model.safetensors")), load_file(str(out / "last" / "model.safetensors"))
    shared = set(before) & set(after)
    assert len(shared) > 10
    for k in shared:
        assert torch.equal(before[k], after[k]), k
    # The heads trained: with the encoder frozen only they can move the dev scores from step 0's evaluation
    # to step 2's (STS's Pearson r, a continuous score, moves with its head's projection; an accuracy on 12
    # rows need not move).
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2] and records[0]["sts_pearson"] != records[1]["sts_pearson"]


def last_tensors(out: Path) -> dict:
    return {f"{name}/{k}": v for name in ("model.safetensors", "heads.safetensors")
            for k, v in load_file(str(out / "last" / name)).items()}


def test_resume_is_bit_identical(tiny_bert_dir, data_dir, tmp_path):
    straight, part = tmp_path / "straight", tmp_path / "part"
    run_quiet(argv(tiny_bert_dir, data_dir, straight, steps=4, max_train_examples=10))
    run_quiet(argv(tiny_bert_dir, data_dir, part, steps=2, max_train_examples=10))
    summary = run_quiet(["--resume", "--out-dir", str(part), "--steps", "4"])  # the rest from config.json
    assert summary["step"] == 4
    a, b = last_tensors(straight), last_tensors(part)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert torch.load(straight / "last" / "training_state.pt", weights_only=False)["samplers"] == \
        torch.load(part / "last" / "training_state.pt", weights_only=False)["samplers"]
    assert [json.loads(l)["step"] for l in (part / "metrics.jsonl").read_text().splitlines()] == [0, 2, 4]
    assert (part / "predictions" / "sst-dev-output.csv").read_bytes() == \
        (straight / "predictions" / "sst-dev-output.csv").read_bytes()


def test_sigterm_writes_last_and_resumes_bit_identically(tiny_bert_dir, data_dir, tmp_path, monkeypatch, capsys):
    """SIGTERM during step 3 of 4 (--eval-every 2): the step is finished, last/ written, exit 143, no
    predictions; --resume ends where an uninterrupted run ends, bit for bit."""
    import os
    import signal

    from bertcf.cli import run_main
    multitask, training = command, mt

    straight, part = tmp_path / "straight", tmp_path / "part"
    run_quiet(argv(tiny_bert_dir, data_dir, straight, steps=4, max_train_examples=10))
    real, calls = training.train_batch, {"n": 0}

    def batch_then_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)
    monkeypatch.setattr(training, "train_batch", batch_then_signal)
    assert run_main(multitask.run, argv(tiny_bert_dir, data_dir, part, steps=4, max_train_examples=10)) == 143
    assert "stopped by SIGTERM at step 3" in capsys.readouterr().err
    assert torch.load(part / "last" / "training_state.pt", weights_only=False)["step"] == 3
    assert not (part / "predictions").exists()
    monkeypatch.undo()
    assert run_quiet(["--resume", "--out-dir", str(part)])["step"] == 4
    a, b = last_tensors(straight), last_tensors(part)
    assert all(torch.equal(a[k], b[k]) for k in a) and a.keys() == b.keys()


def with_old_qqp_name(d):
    """``d`` as runs wrote it before QQP had one name: 'qqp' -> 'para', 'qqp_*' -> 'para_*'."""
    if not isinstance(d, dict):
        return d
    return {("para" + k[3:] if isinstance(k, str) and (k == "qqp" or k.startswith("qqp_")) else k): with_old_qqp_name(v)
            for k, v in d.items()}


def test_a_run_from_before_the_qqp_rename_loads_and_resumes(tiny_bert_dir, data_dir, tmp_path, capsys):
    """A run written when QQP was "para" (--para-* flags, para_head tensors, para_* settings, a
    "para" sampler) still loads, predicts and resumes bit-identically; old flags still parse."""
    from safetensors.torch import save_file

    straight, part = tmp_path / "straight", tmp_path / "part"
    run_quiet(argv(tiny_bert_dir, data_dir, straight, steps=4, max_train_examples=10))
    run_quiet(argv(tiny_bert_dir, data_dir, part, steps=2, max_train_examples=10, qqp_batch_size=None,
                   para_batch_size=12, para_test=tmp_path / "absent.csv"))
    assert "note: --para-batch-size is now --qqp-batch-size" in capsys.readouterr().err
    for name in ("config.json", "best/multitask.json", "last/multitask.json"):
        (part / name).write_text(json.dumps(with_old_qqp_name(json.loads((part / name).read_text()))))
    for name in ("best/heads.safetensors", "last/heads.safetensors"):
        save_file(with_old_qqp_name(load_file(str(part / name))), str(part / name))
    state = torch.load(part / "last" / "training_state.pt", weights_only=False)
    torch.save(with_old_qqp_name(state), part / "last" / "training_state.pt")
    assert json.loads((part / "config.json").read_text())["para_batch_size"] == 12  # not the default 96
    assert "para_head.1.weight" in load_file(str(part / "last" / "heads.safetensors"))

    assert mtm.MultitaskModel.from_pretrained(part).qqp_head[1].weight.shape == (16, 32)
    run_quiet(["--predict-only", "--checkpoint", str(part), "--out-dir", str(tmp_path / "again")])
    assert not (tmp_path / "again" / "predictions" / "para-test-output.csv").exists()  # the saved para_test
    assert (tmp_path / "again" / "predictions" / "para-dev-output.csv").is_file()
    summary = run_quiet(["--resume", "--out-dir", str(part), "--steps", "4"])
    assert summary["step"] == 4
    a, b = last_tensors(straight), last_tensors(part)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert json.loads((part / "metrics.json").read_text()) | {"checkpoint": None} == \
        json.loads((straight / "metrics.json").read_text()) | {"checkpoint": None}


def test_flow_checkpoint_gives_F_x_and_the_flow_is_fine_tuned(tiny_bert_dir, data_dir, tmp_path):
    # A pretraining run directory: its own config.json, and best/ = encoder + flow.
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    encoder.flow = Glow(encoder.dim, num_blocks=1)
    torch.manual_seed(0)
    with torch.no_grad():
        encoder.flow.train()(torch.randn(16, encoder.dim))  # ActNorm's data-dependent init, as after training
        for p in encoder.flow.parameters():
            p.add_(0.05 * torch.randn_like(p))
    run_dir = tmp_path / "joint"
    encoder.save_pretrained(run_dir / "best")
    (run_dir / "config.json").write_text(json.dumps({"stage": "joint"}))
    flow_before = load_file(str(run_dir / "best" / "flow.safetensors"))

    model = mtm.MultitaskModel(SentenceEncoder.from_pretrained(resolve_encoder_path(run_dir)), list(T.values()))
    model.eval()
    ids, mask = torch.tensor([[2, 100, 200, 3]]), torch.ones(1, 4, dtype=torch.long)
    u = model.encoder.embed(ids, mask)
    assert torch.allclose(model.encoder(ids, mask), model.encoder.flow(u)[0])

    out = tmp_path / "ft"
    run_quiet(argv(tiny_bert_dir, data_dir, out, steps=2, encoder=run_dir, lr=1e-3))
    after = load_file(str(out / "last" / "flow.safetensors"))
    assert any(not torch.equal(flow_before[k], after[k]) for k in flow_before if after[k].is_floating_point())
    frozen = tmp_path / "ft-frozen-flow"
    run_quiet(argv(tiny_bert_dir, data_dir, frozen, steps=2, encoder=run_dir, lr=1e-3, freeze_flow=True))
    after = load_file(str(frozen / "last" / "flow.safetensors"))
    assert all(torch.equal(flow_before[k], after[k]) for k in flow_before)
    assert (frozen / "predictions" / "sts-dev-output.csv").is_file()
    dropped = tmp_path / "ft-dropped-flow"  # heads on f(x): the flow left out of the run
    run_quiet(argv(tiny_bert_dir, data_dir, dropped, steps=2, encoder=run_dir, lr=1e-3, drop_flow=True))
    assert not (dropped / "last" / "flow.safetensors").exists()
    assert mtm.MultitaskModel.from_pretrained(dropped / "last").encoder.flow is None
    assert (dropped / "predictions" / "sts-dev-output.csv").is_file()


# ---- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["missing_file", "missing_data_dir", "bad_flag", "unknown_flag", "bad_margin",
                                  "predict_only_no_checkpoint", "predict_only_bad_checkpoint", "bad_encoder",
                                  "drop_and_freeze_flow"])
def test_bad_input_is_one_line_and_status_2(case, tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = {
        "missing_file": argv(tiny_bert_dir, data_dir, out, sst_train=tmp_path / "nope.csv"),
        "missing_data_dir": argv(tiny_bert_dir, tmp_path / "no-data", out),
        "bad_flag": argv(tiny_bert_dir, data_dir, out, sst_batch_size=0),
        "unknown_flag": argv(tiny_bert_dir, data_dir, out) + ["--bogus"],
        "bad_margin": argv(tiny_bert_dir, data_dir, out, qqp_margin=1.0),
        "predict_only_no_checkpoint": ["--predict-only"],
        "predict_only_bad_checkpoint": ["--predict-only", "--checkpoint", str(tmp_path)],
        "bad_encoder": argv(tmp_path / "no-such-bert", data_dir, out),
        "drop_and_freeze_flow": argv(tiny_bert_dir, data_dir, out, drop_flow=True, freeze_flow=True),
    }[case]
    if case in ("unknown_flag", "bad_flag", "bad_margin"):  # argparse's error(): exit status 2 at parsing
        with pytest.raises(SystemExit) as e:
            run_main(command.run, args)
        assert e.value.code == 2
    else:
        assert run_main(command.run, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0], err
    assert not out.exists()  # nothing half-written


@pytest.mark.slow
def test_torchrun_equals_one_process_on_the_global_batch(tiny_bert_dir, data_dir, tmp_path):
    """run_multitask.py under torchrun (2 gloo processes, each with half of every task's batch,
    one encoder pass each) against one process on the whole batches, dropout off everywhere: the
    same weights after 3 steps, the same logged loss, one run directory."""
    import subprocess

    flags = dict(steps=3, eval_every=3, dropout=0, sst_dropout=0, sts_dropout=0, lr=1e-3)
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    cmd, env = torchrun(REPO / "run_multitask.py", *argv(tiny_bert_dir, data_dir, ddp, **flags))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    run_quiet(argv(tiny_bert_dir, data_dir, single, **flags))  # meanwhile
    log = proc.communicate(timeout=180)[0]
    assert proc.returncode == 0, log[-4000:]
    assert log.count("mean dev (during training)") == 1
    a, b = load_file(str(ddp / "last" / "model.safetensors")), load_file(str(single / "last" / "model.safetensors"))
    for k in b:
        atol = 3 * 1e-3 if k.endswith("attention.self.key.bias") else 1e-5  # see tests/training/test_pretrain.py
        torch.testing.assert_close(a[k].double(), b[k].double(), rtol=0, atol=atol, msg=k)
    heads_a, heads_b = (load_file(str(d / "last" / mtm.HEADS_FILE)) for d in (ddp, single))
    for k in heads_b:
        torch.testing.assert_close(heads_a[k], heads_b[k], rtol=0, atol=1e-5, msg=k)
    logged = [json.loads(line) for line in (ddp / "metrics.jsonl").read_text().splitlines()]
    reference = [json.loads(line) for line in (single / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == [m["step"] for m in reference] == [0, 3]
    assert logged[-1]["mean_dev"] == pytest.approx(reference[-1]["mean_dev"], abs=1e-4)
    start = load_file(str(Path(tiny_bert_dir) / "model.safetensors"))
    assert not torch.equal(start["encoder.layer.0.output.dense.weight"], a["encoder.layer.0.output.dense.weight"])


# ---- --pair-encoding cross: the pairs encoded jointly ---------------------------------------------
def test_joint_losses_by_hand():
    logits, labels = torch.tensor([0.0, 2.0, -1.0]), torch.tensor([1.0, 0.0, 0.0])
    expected = (math.log(2) + math.log(1 + math.exp(2)) + math.log(1 + math.exp(-1))) / 3
    assert losses.PairLogitLoss()(logits, labels).item() == pytest.approx(expected, abs=1e-6)
    # STS: the score against gold / 5: (0.5 - 0.5)^2 and (1.2 - 1.0)^2
    assert losses.PairScoreLoss()(torch.tensor([0.5, 1.2]), torch.tensor([2.5, 5.0])).item() == pytest.approx(0.02)
    # the pair tasks' losses when read jointly
    def head(task):
        return build_head(task, Widths(8, 8, 4), "cross")
    assert isinstance(head(T["qqp"]).criterion, losses.PairLogitLoss)
    assert head(T["sts"]).loss(torch.tensor([0.5, 1.2]), torch.tensor([2.5, 5.0])).item() == pytest.approx(0.02)
    three = T["qqp"].replace(num_classes=3, loss="softmax")  # three classes read jointly: cross-entropy
    assert isinstance(head(three).criterion, losses.ClassificationLoss)


def test_joint_prediction_rules():
    assert predict(T["qqp"], torch.tensor([0.0, -0.01, 3.0]), "cross").tolist() == [1, 0, 1]
    assert predict(T["sts"], torch.tensor([0.5, -0.2, 1.3]), "cross").tolist() == pytest.approx([2.5, 0.0, 5.0])


def test_joint_tokens_are_the_tokenizers_pair_encoding(tiny_bert_dir, data_dir):
    tokenizer = SentenceEncoder.from_pretrained(tiny_bert_dir).tokenizer
    data = load_task(T["sts"], "dev", tokenizer, 24, joint=True, path=data_dir / "sts-dev.csv")
    rows = read_sts(data_dir / "sts-dev.csv", labeled=False)
    enc = tokenizer([r.sentence1 for r in rows], [r.sentence2 for r in rows], truncation="longest_first", max_length=24)
    assert len(data.tokens) == 1 and data.tokens[0] == enc["input_ids"] and data.token_types == enc["token_type_ids"]
    assert any(1 in t for t in data.token_types) and data.subset([2, 0]).token_types == [enc["token_type_ids"][i]
                                                                                         for i in (2, 0)]


def test_joint_forward_equals_each_part_alone(tiny_bert_dir, data_dir):
    """One pass over SST sentences and joint pairs: SST's logits are the bi model's head on the
    encoder's sentence vector, the pair heads read BERT's pooled [CLS] of each pair (token types on)."""
    torch.manual_seed(0)
    model = mtm.MultitaskModel(SentenceEncoder.from_pretrained(tiny_bert_dir), list(T.values()), pair_encoding="cross").eval()
    assert model.qqp_head[1].weight.shape == (1, model.encoder.dim)
    tokenizer = model.encoder.tokenizer
    sst = load_task(T["sst"], "dev", tokenizer, 24, path=data_dir / "ids-sst-dev.csv").subset(range(3))
    qqp = load_task(T["qqp"], "dev", tokenizer, 24, joint=True, path=data_dir / "quora-dev.csv").subset(range(4))
    sts = load_task(T["sts"], "dev", tokenizer, 24, joint=True, path=data_dir / "sts-dev.csv").subset(range(2))
    inputs, _ = mt.train_batch({"sst": sst, "qqp": qqp, "sts": sts}, {"sst": [0, 1, 2], "qqp": [0, 1, 2, 3],
                                                                     "sts": [0, 1]}, 0, "cpu",
                              {t: model.heads[t].label_tensor(d.labels) for t, d in (("sst", sst), ("qqp", qqp), ("sts", sts))})
    out = model(**inputs)
    ids, mask = pad_batch(sst.tokens[0], 0)
    torch.testing.assert_close(out["sst"], model.sst_head(model.encoder(ids, mask)), rtol=1e-5, atol=1e-6)
    for task, data in (("qqp", qqp), ("sts", sts)):
        ids, types, mask = pad_pairs(data.tokens[0], data.token_types)
        pooled = model.encoder.bert(ids, mask, types)["pooler_output"]
        torch.testing.assert_close(out[task], model.heads[task](pooled).squeeze(-1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.joint_head_outputs(task, data.tokens[0], data.token_types, batch_size=3),
                                   out[task], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def cross_run(tiny_bert_dir, data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mt-cross") / "run"
    run_quiet(argv(tiny_bert_dir, data_dir, out, pair_encoding="cross", lr=1e-3, proj_dim=None))
    return out


def test_cross_run_writes_the_prediction_files(cross_run, data_dir):
    assert sorted(p.name for p in (cross_run / "predictions").iterdir()) == sorted(PREDICTION_FILES)
    for task, (dev, test, reader) in INPUT_FILES.items():
        for split, name in (("dev", dev), ("test", test)):
            header, ids, values = read_predictions(cross_run / "predictions" / mtm_metrics.prediction_file(task, split))
            assert header == f"id \t {mtm_metrics.PREDICTION_HEADERS[task]} "
            assert ids == [r.id for r in reader(data_dir / name, labeled=False)]
            numbers = [float(v) for v in values]
            if task == "sts":
                assert all(0 <= v <= 5 for v in numbers)
            else:
                assert set(numbers) <= ({0, 1, 2, 3, 4} if task == "sst" else {0, 1})
    assert json.loads((cross_run / "best" / "multitask.json").read_text())["pair_encoding"] == "cross"
    assert json.loads((cross_run / "config.json").read_text())["pair_encoding"] == "cross"
    metrics = json.loads((cross_run / "metrics.json").read_text())
    gold = {r.id: r.label for r in read_sts(data_dir / "sts-dev.csv")}
    _, ids, values = read_predictions(cross_run / "predictions" / "sts-dev-output.csv")
    assert metrics["sts_pearson"] == pytest.approx(pearson([float(v) for v in values], [gold[i] for i in ids]),
                                                   abs=1e-3)  # the file rounds to 4 decimals
    model = mtm.MultitaskModel.from_pretrained(cross_run)
    assert model.pair_encoding == "cross" and model.sts_head[1].out_features == 1


def test_cross_predict_only_reproduces_the_files(cross_run, tmp_path):
    # the checkpoint says cross: --pair-encoding need not (and cannot) be given again
    run_quiet(["--predict-only", "--checkpoint", str(cross_run), "--out-dir", str(tmp_path / "again"),
               "--device", "cpu"])
    for name in PREDICTION_FILES:
        assert (tmp_path / "again" / "predictions" / name).read_bytes() == \
            (cross_run / "predictions" / name).read_bytes(), name


def test_cross_resume_is_bit_identical(tiny_bert_dir, data_dir, tmp_path):
    straight, part = tmp_path / "straight", tmp_path / "part"
    flags = dict(max_train_examples=10, pair_encoding="cross", lr=1e-3, proj_dim=None)
    run_quiet(argv(tiny_bert_dir, data_dir, straight, steps=4, **flags))
    run_quiet(argv(tiny_bert_dir, data_dir, part, steps=2, **flags))
    assert run_quiet(["--resume", "--out-dir", str(part), "--steps", "4"])["step"] == 4
    a, b = last_tensors(straight), last_tensors(part)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (part / "predictions" / "sts-dev-output.csv").read_bytes() == \
        (straight / "predictions" / "sts-dev-output.csv").read_bytes()
