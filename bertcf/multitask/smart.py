"""SMART's smoothness-inducing adversarial regulariser (Jiang et al. 2020, "SMART: Robust and
Efficient Fine-Tuning for Pre-trained Natural Language Models through Principled Regularized
Optimization", section 3.1), for the multitask fine-tuning of issue 56.

The regulariser is max over ||x~ - x|| <= eps of l_s(f(x~), f(x)): how far the model's outputs
move when its input embeddings x move a little, in the worst direction. It is approximated as
the paper's official code (MT-DNN's adversarial training) and smart-pytorch do: start from
Gaussian noise, take ``num_steps`` steps up the gradient of l_s with respect to the noise, each
normalised by ``norm_fn``, then return l_s at the final perturbation, where its gradient trains
the model. The interface and the arithmetic are those of smart-pytorch's ``SMARTLoss`` (the test
compares the two on the same noise); the code is written here.

In a training step, with minBERT's ``inputs_embeds`` (the word embeddings; the position and
token-type embeddings are added inside, as in transformers)::

    embeds = encoder.bert.embeddings.word_embeddings(input_ids)              # [b, t, D]
    def outputs(e):                                                          # the eval_fn
        u = encoder(input_ids, attention_mask, num_tokens=n, inputs_embeds=e)  # [b, D]
        return heads(u)                 # the task heads on their rows: {task: output}
    clean = outputs(embeds)             # the step's ordinary forward, from the same embeddings
    smart = SMARTLoss(outputs, {"sst": sym_kl_loss, "sts": squared_error_loss, ...})
    loss = task_loss(clean) + check_smart_weight(weight) * smart(embeds, clean)

``smart(embeds, clean)`` runs ``eval_fn`` ``num_steps + 1`` more times (the noise's steps and the
final one); dropout draws anew in each, as in MT-DNN.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..errors import UsageError


def inf_norm(x: Tensor) -> Tensor:
    """The max-norm of each vector along the last dimension, kept: [..., D] -> [..., 1]."""
    return x.abs().amax(dim=-1, keepdim=True)


def sym_kl_loss(input: Tensor, target: Tensor, reduction: str = "batchmean") -> Tensor:
    """Symmetric KL divergence of classification logits: KL(p_target || p_input) +
    KL(p_input || p_target), p = softmax over the last dimension, each term with its reference
    distribution detached (MT-DNN's SymKlCriterion, smart-pytorch's sym_kl_loss). Inputs [b, C]
    logits; output a float32 scalar. ``reduction``: F.kl_div's; "batchmean" (MT-DNN's) keeps it
    on the scale of a per-example loss, "sum" is smart-pytorch's default."""
    input, target = input.float(), target.float()
    return (F.kl_div(F.log_softmax(input, dim=-1), F.softmax(target.detach(), dim=-1), reduction=reduction)
            + F.kl_div(F.log_softmax(target, dim=-1), F.softmax(input.detach(), dim=-1), reduction=reduction))


def binary_sym_kl_loss(input: Tensor, target: Tensor, reduction: str = "batchmean") -> Tensor:
    """:func:`sym_kl_loss` of one logit per example ([b], a sigmoid classifier such as QQP's with
    jointly encoded pairs): the logit z is the two-class logits (0, z)."""
    def two_class(z):
        return torch.stack([torch.zeros_like(z), z], dim=-1)
    return sym_kl_loss(two_class(input), two_class(target), reduction)


def squared_error_loss(input: Tensor, target: Tensor) -> Tensor:
    """Mean squared difference of regression outputs (any shape, the same for both), float32."""
    return F.mse_loss(input.float(), target.float())


def check_smart_weight(weight, flag: str = "--smart-weight") -> float:
    """The regulariser's weight as a float; UsageError unless it is a finite number >= 0."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        raise UsageError(f"{flag} must be a finite number >= 0, not {weight!r}")
    return float(weight)


def _detached(out):
    """Outputs (a tensor, or a tuple or dict of them) cut from the graph."""
    if isinstance(out, Tensor):
        return out.detach()
    if isinstance(out, dict):
        return {k: _detached(v) for k, v in out.items()}
    return type(out)(_detached(v) for v in out)


class SMARTLoss(nn.Module):
    """The SMART regulariser, smart-pytorch's ``SMARTLoss`` interface.

    - ``eval_fn(embed) -> outputs``: the model's outputs from input embeddings [b, t, D], a tensor
      or a dict task -> output (an output may also be a tuple, e.g. a pair's two projections);
    - ``loss_fn(perturbed, clean) -> scalar``: the divergence l_s between outputs
      (:func:`sym_kl_loss` for logits, :func:`squared_error_loss` for scores); with dict outputs,
      a dict task -> such a function, and l_s is the sum over its tasks (python's sum, in its
      order; weigh a task inside its function), so one perturbation regularises every task of
      the step; a task missing from it is not regularised;
    - ``loss_last_fn``: l_s of the final step, the one returned (default ``loss_fn``);
    - ``norm_fn``: what each step of the noise is divided by (default :func:`inf_norm`, per
      embedding vector, as MT-DNN and smart-pytorch);
    - ``num_steps`` (1), ``step_size`` (1e-3), ``epsilon`` (1e-6, added to the norm),
      ``noise_var`` (1e-5; the standard deviation of the initial noise, as smart-pytorch and
      MT-DNN use it, the paper's sigma).

    ``forward(embed, state)``: ``embed`` the clean input embeddings [b, t, D], ``state`` the clean
    outputs ``eval_fn(embed)``. Returns the scalar l_s(eval_fn(embed + noise), state); its gradient
    flows into the model through both the perturbed and the clean outputs (each term of the
    symmetric KL detaches its own reference). The noise's steps use the clean outputs detached."""

    def __init__(self, eval_fn: Callable, loss_fn: Callable | dict, loss_last_fn: Callable | dict | None = None,
                 norm_fn: Callable = inf_norm, num_steps: int = 1, step_size: float = 1e-3,
                 epsilon: float = 1e-6, noise_var: float = 1e-5):
        super().__init__()
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 0:
            raise UsageError(f"SMART's number of steps must be a whole number >= 0, not {num_steps!r}")
        for name, value in (("step size", step_size), ("epsilon", epsilon), ("noise", noise_var)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise UsageError(f"SMART's {name} must be a finite number >= 0, not {value!r}")
        self.eval_fn = eval_fn
        self.loss_fn = loss_fn
        self.loss_last_fn = loss_fn if loss_last_fn is None else loss_last_fn
        self.norm_fn = norm_fn
        self.num_steps = num_steps
        self.step_size = float(step_size)
        self.epsilon = float(epsilon)
        self.noise_var = float(noise_var)

    @staticmethod
    def divergence(loss_fn: Callable | dict, perturbed, clean) -> Tensor:
        """l_s between two outputs: ``loss_fn(perturbed, clean)``, or with a dict of per-task
        functions the sum of each task's."""
        if isinstance(loss_fn, dict):
            return sum(fn(perturbed[task], clean[task]) for task, fn in loss_fn.items())
        return loss_fn(perturbed, clean)

    def forward(self, embed: Tensor, state) -> Tensor:
        noise = (torch.randn_like(embed) * self.noise_var).requires_grad_()
        clean = _detached(state)
        for _ in range(self.num_steps):
            # Move the noise up the gradient of l_s, where the outputs change fastest...
            loss = self.divergence(self.loss_fn, self.eval_fn(embed + noise), clean)
            grad, = torch.autograd.grad(loss, noise)
            step = noise + self.step_size * grad
            # ... and normalise it, as the official code does (not a projection on a ball).
            noise = (step / (self.norm_fn(step) + self.epsilon)).detach().requires_grad_()
        return self.divergence(self.loss_last_fn, self.eval_fn(embed + noise.detach()), state)

    def extra_repr(self) -> str:
        return (f"num_steps={self.num_steps}, step_size={self.step_size}, epsilon={self.epsilon}, "
                f"noise_var={self.noise_var}")
