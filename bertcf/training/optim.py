"""The optimiser every training command uses (AdamW, no decay on 1-D parameters), its learning-rate
schedule, and one optimiser step (autocast, scaled backward, clipping)."""
from __future__ import annotations

import torch

from ..errors import UsageError
from ..utils.precision import autocast


def make_optimizer(params, lr: float, weight_decay: float, device) -> torch.optim.AdamW:
    """AdamW, as one fused kernel on a GPU and on the CPU (where torch's default loops over the
    parameters one by one; docs/BENCHMARKS.md has the figures). Biases,
    LayerNorm/ActNorm and other 1-D parameters get no weight decay, as in BERT. ``params``: the
    parameters, or parameter groups ({"params": [...], "lr": x}) for parts with their own
    learning rate (a group without "lr" gets ``lr``)."""
    params = list(params)
    parts = params if params and isinstance(params[0], dict) else [{"params": params}]
    groups = []
    for part in parts:
        trained = [p for p in part["params"] if p.requires_grad]
        part_lr = part.get("lr", lr)
        groups += [{"params": [p for p in trained if p.ndim >= 2], "weight_decay": weight_decay, "lr": part_lr},
                   {"params": [p for p in trained if p.ndim < 2], "weight_decay": 0.0, "lr": part_lr}]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise UsageError("nothing to train: every parameter is frozen")
    fused = torch.device(device).type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=lr, fused=fused)


def make_scheduler(optimizer, kind: str, warmup_steps: int, total_steps: int):
    def factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "linear":
            return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
        return 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def plain_backward(loss, scaler) -> dict:
    """The update of every training run but stage 3's methods: the backward of the (scaled) loss.
    Returns the scalars it logs: none."""
    scaler.scale(loss).backward()
    return {}


def update(optimizer, scaler, compute, device, precision: str, max_grad_norm: float = 0.0,
           backward=plain_backward):
    """One optimiser step: ``compute() -> (losses, scalars)`` under autocast, ``backward(losses,
    scaler) -> scalars`` (the gradients, scaled by the GradScaler ``scaler``; stage 3's is
    ``StepMethods.backward``), clipping to ``max_grad_norm`` (0: off), the step. ``losses``: the
    step's loss, or what ``backward`` takes, with the loss as its ``total`` (stage 3's
    ``StepLosses``). Returns the loss and ``compute``'s scalars with ``backward``'s (the weights a
    multitask method gave). The Trainer's loop and the bench both step through here."""
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, precision):
        losses, scalars = compute()
    scalars = scalars | backward(losses, scaler)
    if max_grad_norm > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    return (losses if isinstance(losses, torch.Tensor) else losses.total), scalars
