"""One multitask training step, the one the trainer runs and the bench times::

    loss, scalars = training.optim.update(optimizer, scaler,
                                          lambda: step_losses(model, methods, inputs, labels),
                                          device, precision, max_grad_norm, backward=methods.backward)

Its forward half, :func:`step_losses`: the step's sentences through the encoder once, each task's
head and loss, the losses weighted (and SMART's term) as ``methods`` (a ``StepMethods``) say, as
an explicit :class:`StepLosses`. Its update, ``StepMethods.backward(losses, scaler)``: the one call
every method goes through (LibMTL's ``backward(losses) -> weights``), which fills the gradients and
returns the weights to log. The trainer's ``Step`` draws the step's batches and calls
:func:`step_losses` on them; the bench (``bertcf.bench.workloads.Multitask``) calls it on its own.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class StepLosses:
    """What a multitask step's backward needs (``StepMethods.backward``).

    ``total``: the step's loss, sum_t w_t L_t (python's sum from 0) plus SMART's term, what the
    loop logs and watches and, for the default methods, what it backpropagates; ``weighted``: task
    -> w_t L_t, in the step's task order (an aggregator's rows); ``features``: the encoder's output
    every head reads (a tensor or a list of them: where an aggregator cuts the graph); ``smart``:
    SMART's term (its weight times the regulariser) or None; ``regulariser``: the regulariser,
    detached, to log; ``weights``: task -> the loss weight w_t this step used, to log."""

    total: Tensor
    weighted: dict
    features: Tensor | list
    weights: dict = field(default_factory=dict)
    smart: Tensor | None = None
    regulariser: Tensor | None = None


def step_losses(model, methods, inputs: dict, labels: dict, step_model=None,
                conflicts: Callable[[dict], None] | None = None) -> tuple[StepLosses, dict]:
    """The forward half of one step: ``inputs`` (``MultitaskModel.forward``'s keyword arguments,
    ``trainer.train_batch``'s) through ``step_model`` (``model`` itself, or its
    DistributedDataParallel wrapper), each task's loss on ``labels`` (task -> its labels), weighted
    by ``methods.losses``. ``conflicts(task_losses)``, when given, sees the task losses first (the
    trainer logs the gradient cosines there). Returns the :class:`StepLosses` and the scalars to
    log (``loss_TASK``, each task's unweighted loss)."""
    out, features = (step_model or model)(**inputs, return_features=True)
    task_losses = {task: model.heads[task].loss(y, labels[task]) for task, y in out.items()}
    if conflicts is not None:
        conflicts(task_losses)
    return (methods.losses(task_losses, features, inputs, out),
            {f"loss_{t}": loss.detach() for t, loss in task_losses.items()})
