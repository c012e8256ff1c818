"""What stage 3 shows in TensorBoard beyond the loop's losses and dev metrics:

- ``conflict/cos_A_B``: the cosine between tasks A's and B's gradients on the shared encoder,
  every ``--conflict-every`` steps (:func:`gradient_cosines`; the conflict that gradient surgery
  acts on, Yu et al. 2020);
- ``train/batches_TASK``: the batches each task got (``--task-sampling``);
- the HParams dashboard: the run's settings and its final dev metrics (:func:`write_hparams`), so
  runs compare side by side;
- at the best checkpoint (:func:`write_best_views`): the embedding projector with each
  classification task's dev sentences labelled by class, and the precision-recall curve of each
  pair-classification task's dev predictions (one per class).
"""
from __future__ import annotations

import itertools

import torch

from .evaluation import raw_outputs, sentence_vectors
from .model import MultitaskModel

#: The most dev sentences of a task the projector shows (it loads them all in the browser).
PROJECTOR_ROWS = 2000


def shared_parameters(model: MultitaskModel) -> list[torch.nn.Parameter]:
    """The parameters every task's loss reaches: the encoder's that train, the tasks' own adapters aside."""
    adapters = model.encoder.adapters
    own = {id(p) for t in (adapters.tasks if adapters is not None else ()) for p in adapters.parameters_of(t)}
    return [p for p in model.encoder.parameters() if p.requires_grad and id(p) not in own]


def gradient_cosines(losses: dict, params: list) -> dict:
    """{"cos_A_B": cos(grad L_A, grad L_B)} over ``params`` for each pair of tasks, the gradients
    taken one task at a time with ``torch.autograd.grad`` (the graph kept for the step's own
    backward). A task whose loss does not reach a parameter counts zero there."""
    grads = {}
    for task, loss in losses.items():
        per_param = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        grads[task] = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
                                 for g, p in zip(per_param, params)])
    return {f"cos_{a}_{b}": torch.nn.functional.cosine_similarity(grads[a], grads[b], dim=0).detach()
            for a, b in itertools.combinations(grads, 2)}


def task_conflicts(model: MultitaskModel, losses: dict) -> dict:
    """:func:`gradient_cosines` of a step's task losses on ``model``'s shared parameters; {} with
    one task, or with nothing shared to train (a frozen encoder)."""
    shared = shared_parameters(model)
    return gradient_cosines(losses, shared) if len(losses) > 1 and shared else {}


def _hparam_value(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_hparams(writer, settings: dict, metrics: dict) -> None:
    """The run's settings and final dev metrics in TensorBoard's HParams dashboard, through
    ``writer`` (a SummaryWriter on the run's tb/): the metrics are the eval/ scalars the run
    logged (``metrics``: name -> final value)."""
    from torch.utils.tensorboard.summary import hparams

    values = {k: _hparam_value(v) for k, v in settings.items() if k != "command"}
    experiment, start, end = hparams(values, {f"eval/{k}": float(v) for k, v in metrics.items()})
    for summary in (experiment, start, end):
        writer.file_writer.add_summary(summary)
    writer.flush()


def write_best_views(writer, model: MultitaskModel, dev: dict, step: int, batch_size: int = 128,
                     precision: str | None = None, outputs: dict | None = None, vectors: dict | None = None) -> None:
    """The embedding projector (classification tasks' dev sentences, labelled by class) and the
    precision-recall curves (pair-classification tasks' dev predictions) of ``model``, the best
    checkpoint, at ``step``, through ``writer`` (a SummaryWriter on the run's tb/). ``dev``:
    task -> TaskData; ``outputs`` and ``vectors``: task -> their raw outputs and sentence vectors
    (``evaluation.score``), when the dev sets are scored already (else they are scored here)."""
    outputs, vectors = outputs or {}, vectors or {}
    for name, data in dev.items():
        task, head = data.task, model.heads[name]
        rows = [i for i, label in enumerate(data.labels) if label is not None]
        names = task.labels or [str(c) for c in range(task.num_classes or 0)]
        if head.projector:
            rows = rows[:PROJECTOR_ROWS]
            shown = data.subset(rows)
            found = vectors[name][rows] if name in vectors else sentence_vectors(model, shown, batch_size, precision)
            writer.add_embedding(found, metadata=[names[label] for label in shown.labels], global_step=step,
                                 tag=f"{name}_dev")
        elif head.pr_curve:
            y = outputs[name][rows] if name in outputs else raw_outputs(model, data.subset(rows), batch_size, precision)
            scores = head.positive_scores(y)
            gold = torch.tensor([data.labels[i] for i in rows]).long()
            for c in range(scores.shape[1]) if scores.shape[1] > 2 else [1]:
                writer.add_pr_curve(f"pr/{name}_{names[c]}", (gold == c).int(), scores[:, c].clamp(0, 1), step)
    writer.flush()
