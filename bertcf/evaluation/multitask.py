"""The multitask stage's predictions and dev metrics (the report's section 5.3): SST-5 accuracy,
QQP accuracy, STS Pearson r, their intervals, and the mean of the three that selects the best
checkpoint; the six CS224N prediction files (``write_predictions``)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..data.multitask import TaskData
from ..data.tasks import TASKS
from ..models.multitask import (
    MultitaskModel,
    clamped_cosine,
    predict_joint,
    predict_paraphrase,
    predict_sentiment,
    predict_similarity,
)
from ..utils.files import save_dir_atomic, write_json_atomic
from .bootstrap import interval
from .metrics import accuracy, pearson

METRICS = {"sst": "sst_acc", "qqp": "qqp_acc", "sts": "sts_pearson"}
SELECTION_METRIC = "mean_dev"
PREDICTION_HEADERS = {"sst": "Predicted_Sentiment", "qqp": "Predicted_Is_Paraphrase",
                      "sts": "Predicted_Similiary"}  # sic: the CS224N starter's spelling


def prediction_file(task: str, split: str) -> str:
    """The CS224N name of a prediction file: QQP's are para-{split}-output.csv."""
    return f"{'para' if task == 'qqp' else task}-{split}-output.csv"


def correlation(predicted, gold) -> float:
    """Pearson r; 0.0 when the predictions are constant (r is undefined there, and a constant
    predictor must not win the checkpoint selection by a NaN)."""
    predicted = torch.as_tensor(predicted, dtype=torch.float64)
    if len(predicted) < 2 or float(predicted.std()) == 0.0:
        return 0.0
    return pearson(predicted, gold)


def task_metric(task: str, predictions, gold) -> float:
    """SST and QQP: accuracy; STS: Pearson r (see :func:`correlation`)."""
    if task == "sts":
        return correlation(predictions, gold)
    return accuracy(torch.as_tensor(predictions).long(), torch.as_tensor(gold).long())


def task_interval(task: str, predictions, gold) -> list[float]:
    """[lo, hi]: the 95% percentile bootstrap interval of :func:`task_metric` over the examples
    (1,000 resamples, a fixed seed; :mod:`bertcf.evaluation.bootstrap`). Constant STS predictions, whose r
    is undefined (:func:`correlation` calls it 0), give [nan, nan]."""
    return interval(predictions, gold, "pearson" if task == "sts" else "accuracy")


def mean_dev(metrics: dict) -> float:
    """The selection metric: the mean of SST accuracy, QQP accuracy and STS Pearson r."""
    return sum(metrics[METRICS[t]] for t in TASKS) / len(TASKS)


@torch.inference_mode()
def predict(model: MultitaskModel, data: TaskData, batch_size: int = 128, precision: str | None = None) -> torch.Tensor:
    """Predictions for every row: SST class [n] long, QQP 0/1 [n] long, STS score in [0, 5] [n]
    (a pair task of a cross model: from its head on the jointly encoded pairs)."""
    was_training = model.training
    model.eval()
    try:
        if data.task != "sst" and model.pair_encoding == "cross":
            return predict_joint(data.task, model.joint_outputs(data.task, data.tokens[0], data.token_types,
                                                                batch_size, precision))
        # Both columns of a pair task in one length-sorted pass, then split again.
        vectors = model.encoder.encode_ids([t for col in data.tokens for t in col], batch_size, precision)
        vectors = vectors.to(model.device).split(len(data))
        head = model.head(data.task)
        if data.task == "sst":
            return predict_sentiment(head(vectors[0]).float()).cpu()
        y = clamped_cosine(head(vectors[0]), head(vectors[1]),
                           model.qqp_margin if data.task == "qqp" else model.sts_margin).cpu()
    finally:
        model.train(was_training)
    if data.task == "qqp":
        return predict_paraphrase(y, model.qqp_margin)
    return predict_similarity(y, model.sts_margin)


def evaluate(model: MultitaskModel, dev: dict, batch_size: int = 128, precision: str | None = None,
             limit: int | None = None) -> dict:
    """{'sst_acc', 'qqp_acc', 'sts_pearson', 'mean_dev'} on the labeled rows of the dev sets
    (``dev``: task -> TaskData; ``limit``: the first rows of each only)."""
    metrics = {}
    for task in TASKS:
        data = dev[task].labeled(limit)
        metrics[METRICS[task]] = task_metric(task, predict(model, data, batch_size, precision), data.labels)
    metrics[SELECTION_METRIC] = mean_dev(metrics)
    return metrics


def format_prediction(task: str, value) -> str:
    return f"{float(value):.4f}" if task == "sts" else str(int(value))


def write_predictions(model: MultitaskModel, data: dict, out_dir, batch_size: int = 128,
                      precision: str | None = None, meta: dict | None = None) -> dict:
    """Write OUT/predictions/ (the six CS224N files: 'id \\t Predicted_... ' then 'id , value'
    per row; an absent test set is left out) and OUT/metrics.json (the dev metrics of every
    labeled row, each with its bootstrap interval ``*_ci95``), both atomically. Returns the metrics."""
    out_dir = Path(out_dir)
    files, metrics = {}, {}
    for task in TASKS:
        for split in ("dev", "test"):
            d = data.get((task, split))
            if d is None:
                continue
            predicted = predict(model, d, batch_size, precision)
            lines = [f"id \t {PREDICTION_HEADERS[task]} \n"]
            lines += [f"{i} , {format_prediction(task, v)} \n" for i, v in zip(d.ids, predicted.tolist())]
            files[prediction_file(task, split)] = "".join(lines)
            if split == "dev":
                rows = [k for k, label in enumerate(d.labels) if label is not None]
                gold = [d.labels[k] for k in rows]
                metrics[METRICS[task]] = task_metric(task, predicted[rows], gold)
                metrics[f"{METRICS[task]}_ci95"] = task_interval(task, predicted[rows], gold)
                metrics[f"{task}_dev_examples"] = len(rows)
    metrics = {k: metrics[k] for k in METRICS.values()} | {SELECTION_METRIC: mean_dev(metrics)} \
        | {k: v for k, v in metrics.items() if k not in METRICS.values()} | (meta or {})

    def write(tmp):
        for name, text in files.items():
            (tmp / name).write_text(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_dir_atomic(out_dir / "predictions", write)
    write_json_atomic(out_dir / "metrics.json", metrics)
    return metrics


def summary_line(metrics: dict, out_dir) -> str:
    """The dev metrics in one line, and where the predictions are."""
    return (f"dev: SST acc {metrics['sst_acc']:.4f}, QQP acc {metrics['qqp_acc']:.4f}, "
            f"STS r {metrics['sts_pearson']:.4f}, mean {metrics['mean_dev']:.4f}; "
            f"predictions in {Path(out_dir) / 'predictions'}")
