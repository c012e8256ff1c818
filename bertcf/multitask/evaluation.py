"""Stage 3's predictions and dev metrics (the report's section 5.3): each task's metric (SST-5
accuracy, QQP accuracy, STS Pearson r, ...), its interval, and the mean of the tasks' metrics that
selects the best checkpoint; the prediction files (the CS224N names for the built-in tasks).

Scoring shows its progress in sentences (``Progress``), one count over every set it scores: the
rows are encoded in chunks of whole batches (``in_chunks``), the very batches of one call, so the
outputs do not depend on it."""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError
from ..evaluation.bootstrap import interval
from ..evaluation.metrics import accuracy, pearson, spearman
from ..utils.files import save_dir_atomic, write_json_atomic
from ..utils.progress import Progress, mode_of
from .data import TaskData
from .model import MultitaskModel
from .tasks import Task

SELECTION_METRIC = "mean_dev"
#: Batches encoded between two updates of the scoring's progress.
CHUNK_BATCHES = 8
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
    """The task's declared metric (``task.metric``, :data:`METRICS`) of its predictions."""
    return METRICS[task.metric](predictions, gold)


def task_interval(task: Task, predictions, gold) -> list[float]:
    """[lo, hi]: the 95% percentile bootstrap interval of :func:`task_metric` over the examples
    (1,000 resamples, a fixed seed; :mod:`bertcf.evaluation.bootstrap`). Constant regression
    predictions, whose r is undefined (:func:`correlation` calls it 0), give [nan, nan]."""
    return interval(predictions, gold, BOOTSTRAP_METRICS.get(task.metric, task.metric))


def _accuracy(predictions, gold) -> float:
    return accuracy(torch.as_tensor(predictions).long(), torch.as_tensor(gold).long())


#: A declared metric's name (``tasks.METRICS``) -> metric(predictions, gold). mrr: the predictions are
#: reciprocal ranks (a pair-ranking head's), their mean.
METRICS = {"accuracy": _accuracy,
           "pearson": lambda predicted, gold: correlation(predicted, gold, "pearson"),
           "spearman": lambda predicted, gold: correlation(predicted, gold, "spearman"),
           "mrr": lambda predicted, gold: float(torch.as_tensor(predicted, dtype=torch.float64).mean())}
#: A declared metric's name in ``bertcf.evaluation.bootstrap`` where it differs.
BOOTSTRAP_METRICS = {"mrr": "mean"}


def mean_dev(metrics: dict, tasks: list[Task]) -> float:
    """The selection metric: the mean of the tasks' dev metrics."""
    return sum(metrics[t.metric_key] for t in tasks) / len(tasks)


# ---- outputs and predictions -----------------------------------------------------------------------
def in_chunks(encode, lengths: list[int], batch_size: int, shown: Progress | None = None) -> torch.Tensor:
    """``encode(rows)`` (rows: indices) of every row, ``lengths`` their lengths in tokens, called on
    chunks of ``CHUNK_BATCHES`` whole batches in the longest-first order that the encoders here
    batch by (``encode_ids``, ``joint_head_outputs``): a chunk is already in that order, so its batches
    are those of one call over every row, and so are the outputs. ``shown`` advances after each."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    size = batch_size * CHUNK_BATCHES
    encoded = []
    for start in range(0, len(order), size):
        encoded.append(encode(order[start:start + size]))
        if shown is not None:
            shown.advance(len(encoded[-1]))
    if not encoded:
        return encode([])
    outputs = torch.cat(encoded)
    result = torch.empty_like(outputs)
    result[torch.tensor(order)] = outputs
    return result


def sentences(data: TaskData) -> int:
    """The encoder's inputs that scoring ``data`` takes: a row per sentence (a pair read jointly: one)."""
    return len(data) * len(data.tokens)


def sentence_vectors(model: MultitaskModel, data: TaskData, batch_size: int = 128, precision: str | None = None,
                     shown: Progress | None = None) -> torch.Tensor:
    """The encoder's vectors of every sentence of ``data``, column after column ([rows·n, D],
    float32, CPU): a pair task's two columns in one length-sorted pass, through the task's adapter
    where each task has its own."""
    rows = [t for col in data.tokens for t in col]
    with model.adapter_of(data.task.name):
        return in_chunks(lambda chunk: model.encoder.encode_ids([rows[i] for i in chunk], batch_size, precision),
                         [len(t) for t in rows], batch_size, shown)


def raw_outputs(model: MultitaskModel, data: TaskData, batch_size: int = 128, precision: str | None = None,
                shown: Progress | None = None, vectors: torch.Tensor | None = None):
    """A task's raw outputs for every row (its head's view, ``TaskHead.scores``), float32 on the
    CPU: logits [n, C], y = max(cos, h) [n] for a cosine pair, or a joint head's logit or score
    [n]. ``vectors``: its :func:`sentence_vectors`, when computed already (the projector's)."""
    head = model.heads[data.task.name]
    was_training = model.training
    model.eval()
    try:
        if head.joint:
            tokens, types = data.tokens[0], data.token_types
            return in_chunks(lambda chunk: model.joint_head_outputs(data.task.name, [tokens[i] for i in chunk],
                                                                    [types[i] for i in chunk], batch_size, precision),
                             [len(t) for t in tokens], batch_size, shown)
        if vectors is None:
            vectors = sentence_vectors(model, data, batch_size, precision, shown)
        with torch.inference_mode():
            return head.scores(vectors.to(model.device), len(data)).cpu()
    finally:
        model.train(was_training)


def score(model: MultitaskModel, sets: dict, batch_size: int = 128, precision: str | None = None,
          show="none", name: str = "score", vectors_of=()) -> tuple[dict, dict]:
    """(key -> :func:`raw_outputs`, key -> :func:`sentence_vectors` for the keys of ``vectors_of``)
    of every set of ``sets`` (key -> TaskData; None is skipped), with one progress over all their
    sentences (``show``: a mode, or True/False), in lines once it takes a few seconds."""
    sets = {key: data for key, data in sets.items() if data is not None}
    outputs, vectors = {}, {}
    with Progress(mode_of(show), name, sum(map(sentences, sets.values())), unit="sentence", quiet=True) as shown:
        for key, data in sets.items():
            if key in vectors_of:
                vectors[key] = sentence_vectors(model, data, batch_size, precision, shown)
            outputs[key] = raw_outputs(model, data, batch_size, precision, shown, vectors.get(key))
    return outputs, vectors


def evaluate(model: MultitaskModel, dev: dict, batch_size: int = 128, precision: str | None = None,
             limit: int | None = None, show="none", name: str = "evaluate") -> dict:
    """Each task's metric on the labeled rows of its dev set (``dev``: task -> TaskData; ``limit``:
    that many of them, the same random draw every time), and their mean (``mean_dev``); its
    progress as :func:`score` shows it."""
    dev = {task: data.labeled(limit) for task, data in dev.items()}
    outputs, _ = score(model, dev, batch_size, precision, show, name)
    metrics = {data.task.metric_key: task_metric(data.task, model.heads[task].predictions(outputs[task]), data.labels)
               for task, data in dev.items()}
    metrics[SELECTION_METRIC] = mean_dev(metrics, [d.task for d in dev.values()])
    return metrics


def format_prediction(task: Task, value, label_names: bool = False) -> str:
    """A prediction as its file holds it: a score with four decimals, a class index, or with
    ``label_names`` the class's name where the task names its classes (``labels``)."""
    if not task.classes:
        return f"{float(value):.4f}"
    return task.labels[int(value)] if label_names and task.labels else str(int(value))


def read_predictions(path, task: Task) -> dict:
    """id -> the prediction of a prediction file (a score, or a class index, a class's name read
    back); DataError naming the line that is not ``id , value`` (a file cut short or damaged)."""
    out = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines()[1:], 2):
        i, _, value = line.partition(" , ")
        value = value.strip()
        try:
            out[i.strip()] = float(task.labels.index(value) if task.labels and value in task.labels else value)
        except ValueError:
            raise DataError(f"{path} line {number}: not 'id , prediction' ({line[:60]!r}): the file is cut short "
                            f"or damaged") from None
    return out


def final_sets(data: dict) -> dict:
    """The sets a run's end scores: every dev and test file, whole ((task, split) -> TaskData)."""
    return {key: d for key, d in data.items() if d is not None and key[1] in ("dev", "test")}


def write_predictions(model: MultitaskModel, data: dict, out_dir, batch_size: int = 128,
                      precision: str | None = None, meta: dict | None = None, outputs: dict | None = None,
                      label_names: bool = False, show="none") -> dict:
    """Write OUT/predictions/ (per task and split: a header 'id \\t Predicted_... ', then 'id , value'
    per row, as the CS224N files for SST, QQP and STS; an absent test set is left out; values as
    :func:`format_prediction`) and OUT/metrics.json (the dev metrics of every labeled row, each with
    its bootstrap interval ``*_ci95``), both atomically. ``data``: (task, split) -> TaskData or
    None; ``outputs``: their :func:`raw_outputs` when scored already (else scored here, its
    progress shown as ``show`` says). Returns the metrics."""
    out_dir = Path(out_dir)
    data = final_sets(data)
    if outputs is None:
        outputs, _ = score(model, data, batch_size, precision, show, f"score {out_dir.name}")
    files, metrics, tasks = {}, {}, []
    for (name, split), d in data.items():
        task = d.task
        predicted = model.heads[name].predictions(outputs[name, split])
        header = PREDICTION_HEADERS.get(name, "Predicted_Label" if task.classes else "Predicted_Score")
        lines = [f"id \t {header} \n"]
        lines += [f"{i} , {format_prediction(task, v, label_names)} \n" for i, v in zip(d.ids, predicted.tolist())]
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
    scores = ", ".join(f"{t.name} {t.metric_key.rsplit('_', 1)[1]} {metrics[t.metric_key]:.4f}" for t in tasks)
    return f"dev: {scores}, mean {metrics[SELECTION_METRIC]:.4f}; predictions in {Path(out_dir) / 'predictions'}"
