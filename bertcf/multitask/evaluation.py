"""Stage 3's predictions and dev metrics (the report's section 5.3): each task's metric (SST-5
accuracy, QQP accuracy, STS Pearson r, ...), its interval, and the mean of the tasks' metrics that
selects the best checkpoint; the prediction files (the CS224N names for the built-in tasks)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..evaluation.bootstrap import interval
from ..evaluation.metrics import accuracy, pearson, spearman
from ..utils.files import save_dir_atomic, write_json_atomic
from .data import TaskData
from .losses import clamped_cosine
from .model import MultitaskModel
from .tasks import Task

SELECTION_METRIC = "mean_dev"
PREDICTION_HEADERS = {"sst": "Predicted_Sentiment", "qqp": "Predicted_Is_Paraphrase",
                      "sts": "Predicted_Similiary"}  # sic: the CS224N starter's spelling


def prediction_file(task: str, split: str) -> str:
    """A prediction file's name: {task}-{split}-output.csv; QQP's is CS224N's para-{split}-output.csv."""
    return f"{'para' if task == 'qqp' else task}-{split}-output.csv"


def correlation(predicted, gold, metric: str = "pearson") -> float:
    """Pearson (or Spearman) r; 0.0 when the predictions are constant (r is undefined there, and a
    constant predictor must not win the checkpoint selection by a NaN)."""
    predicted = torch.as_tensor(predicted, dtype=torch.float64)
    if len(predicted) < 2 or float(predicted.std()) == 0.0:
        return 0.0
    return pearson(predicted, gold) if metric == "pearson" else spearman(predicted, gold)


def task_metric(task: Task, predictions, gold) -> float:
    """Accuracy for the classification kinds; Pearson or Spearman r for regression."""
    if task.regression:
        return correlation(predictions, gold, task.metric)
    return accuracy(torch.as_tensor(predictions).long(), torch.as_tensor(gold).long())


def task_interval(task: Task, predictions, gold) -> list[float]:
    """[lo, hi]: the 95% percentile bootstrap interval of :func:`task_metric` over the examples
    (1,000 resamples, a fixed seed; :mod:`bertcf.evaluation.bootstrap`). Constant regression
    predictions, whose r is undefined (:func:`correlation` calls it 0), give [nan, nan]."""
    return interval(predictions, gold, task.metric)


def mean_dev(metrics: dict, tasks: list[Task]) -> float:
    """The selection metric: the mean of the tasks' dev metrics."""
    return sum(metrics[t.metric_key] for t in tasks) / len(tasks)


# ---- outputs and predictions -----------------------------------------------------------------------
def raw_outputs(model: MultitaskModel, data: TaskData, batch_size: int = 128, precision: str | None = None):
    """A task's head outputs for every row, float32 on the CPU: logits [n, C] (classification, a
    softmax pair, several classes read jointly), y = max(cos, h) [n] (a cosine pair), or the
    joint head's logit or score [n]."""
    task = model.tasks[data.task.name]
    was_training = model.training
    model.eval()
    try:
        if task.pair and model.pair_encoding == "cross":
            return model.joint_outputs(task.name, data.tokens[0], data.token_types, batch_size, precision)
        with torch.inference_mode():
            # Both columns of a pair task in one length-sorted pass, then split again.
            vectors = model.encoder.encode_ids([t for col in data.tokens for t in col], batch_size, precision)
            vectors = vectors.to(model.device)
            if not task.pair:
                return model.head(task.name)(vectors).float().cpu()
            if task.loss == "softmax":
                return model.head_outputs(task.name, vectors).float().cpu()
            first, second = vectors.split(len(data))
            head = model.head(task.name)
            return clamped_cosine(head(first), head(second), task.margin).cpu()
    finally:
        model.train(was_training)


def predictions_from(task: Task, y: torch.Tensor, pair_encoding: str = "bi") -> torch.Tensor:
    """Raw outputs -> predictions: a class (long) or a score in the task's range (float).

    - logits: the argmax class;
    - a cosine pair's y = max(cos, h): duplicate (1) when y >= (1 + h) / 2; a score, y rescaled
      from [h, 1] to the label range;
    - a joint logit: 1 when >= 0 (even odds); a joint score s: low + (high - low) s, clamped."""
    low, high = task.label_range
    if y.dim() == 2:
        return y.argmax(dim=-1)
    if task.pair and pair_encoding == "cross":
        return (y >= 0).long() if not task.regression else (low + (high - low) * y.float()).clamp(low, high)
    if task.regression:
        return (y.float() - task.margin) / (1 - task.margin) * (high - low) + low
    return (y >= (1 + task.margin) / 2).long()


def predict(model: MultitaskModel, data: TaskData, batch_size: int = 128, precision: str | None = None) -> torch.Tensor:
    """Predictions for every row of ``data`` (see :func:`predictions_from`)."""
    return predictions_from(model.tasks[data.task.name], raw_outputs(model, data, batch_size, precision),
                            model.pair_encoding)


def positive_scores(task: Task, y: torch.Tensor, pair_encoding: str = "bi") -> torch.Tensor:
    """A pair-classification task's raw outputs as scores in [0, 1] per class, for precision-recall
    curves: [n, C] class probabilities (softmax of logits; [n, 2] from a binary score)."""
    if y.dim() == 2:
        return torch.softmax(y.float(), dim=-1)
    p = torch.sigmoid(y.float()) if pair_encoding == "cross" else ((y.float() - task.margin) / (1 - task.margin))
    return torch.stack([1 - p, p], dim=-1)


def evaluate(model: MultitaskModel, dev: dict, batch_size: int = 128, precision: str | None = None,
             limit: int | None = None) -> dict:
    """Each task's metric on the labeled rows of its dev set (``dev``: task -> TaskData; ``limit``:
    the first rows of each only), and their mean (``mean_dev``)."""
    metrics = {}
    for name, data in dev.items():
        data = data.labeled(limit)
        metrics[data.task.metric_key] = task_metric(data.task, predict(model, data, batch_size, precision), data.labels)
    metrics[SELECTION_METRIC] = mean_dev(metrics, [d.task for d in dev.values()])
    return metrics


def format_prediction(task: Task, value) -> str:
    return f"{float(value):.4f}" if task.regression else str(int(value))


def write_predictions(model: MultitaskModel, data: dict, out_dir, batch_size: int = 128,
                      precision: str | None = None, meta: dict | None = None) -> dict:
    """Write OUT/predictions/ (per task and split: 'id \\t Predicted_... ' then 'id , value' per
    row, the CS224N files for SST, QQP and STS; an absent test set is left out) and
    OUT/metrics.json (the dev metrics of every labeled row, each with its bootstrap interval
    ``*_ci95``), both atomically. ``data``: (task, split) -> TaskData or None. Returns the metrics."""
    out_dir = Path(out_dir)
    files, metrics, tasks = {}, {}, []
    for (name, split), d in data.items():
        if d is None or split not in ("dev", "test"):
            continue
        task = d.task
        predicted = predict(model, d, batch_size, precision)
        header = PREDICTION_HEADERS.get(name, "Predicted_Label" if not task.regression else "Predicted_Score")
        lines = [f"id \t {header} \n"]
        lines += [f"{i} , {format_prediction(task, v)} \n" for i, v in zip(d.ids, predicted.tolist())]
        files[prediction_file(name, split)] = "".join(lines)
        if split == "dev":
            tasks.append(task)
            rows = [k for k, label in enumerate(d.labels) if label is not None]
            gold = [d.labels[k] for k in rows]
            metrics[task.metric_key] = task_metric(task, predicted[rows], gold)
            metrics[f"{task.metric_key}_ci95"] = task_interval(task, predicted[rows], gold)
            metrics[f"{name}_dev_examples"] = len(rows)
    keys = [t.metric_key for t in tasks]
    metrics = {k: metrics[k] for k in keys} | {SELECTION_METRIC: mean_dev(metrics, tasks)} \
        | {k: v for k, v in metrics.items() if k not in keys} | (meta or {})

    def write(tmp):
        for file_name, text in files.items():
            (tmp / file_name).write_text(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_dir_atomic(out_dir / "predictions", write)
    write_json_atomic(out_dir / "metrics.json", metrics)
    return metrics


def summary_line(metrics: dict, tasks: list[Task], out_dir) -> str:
    """The dev metrics in one line, and where the predictions are."""
    parts = ", ".join(f"{t.name} {t.metric_key.rsplit('_', 1)[1]} {metrics[t.metric_key]:.4f}" for t in tasks)
    return f"dev: {parts}, mean {metrics[SELECTION_METRIC]:.4f}; predictions in {Path(out_dir) / 'predictions'}"
