"""The multitask stage's dev metrics (the report's section 5.3): SST-5 accuracy, QQP accuracy, STS
Pearson r, their intervals, and the mean of the three that selects the best checkpoint."""
from __future__ import annotations

import torch

from ..data.tasks import TASKS
from .bootstrap import interval
from .metrics import accuracy, pearson

METRICS = {"sst": "sst_acc", "qqp": "qqp_acc", "sts": "sts_pearson"}
SELECTION_METRIC = "mean_dev"


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
