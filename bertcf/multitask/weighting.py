"""Loss weighting for multitask training (issue 56): how a step's task losses L_t become the loss
it minimises.

- :class:`FixedWeighting`: sum_t w_t L_t with constant weights (the report's 5 SST, 20 QQP, 1 STS),
  computed as the report's step added the heads' losses (python's sum from 0), bit for bit.
- :class:`UncertaintyWeighting`: Kendall, Gal & Cipolla 2018, "Multi-Task Learning Using
  Uncertainty to Weigh Losses for Scene Geometry and Semantics": a learned log-variance
  s_t = log sigma_t^2 per task, sum_t (exp(-s_t) L_t / 2 + s_t / 2). That is the paper's
  regression form (its eq. 7 with s = log sigma^2) applied to every task, as LibMTL's ``UW`` and
  torchjd's ``scalarization.UW`` implement it (the variant exp(-s_t) L_t + s_t found elsewhere
  only doubles it). s_t starts at 0 (sigma^2 = 1, torchjd's choice; LibMTL starts at -0.5:
  ``log_var_init``). The s_t are parameters that the run's optimizer must train.
- :class:`DynamicWeightAverage`: Liu, Johns & Davison 2019, "End-to-End Multi-Task Learning with
  Attention": lambda_t = K exp(r_t / T) / sum_k exp(r_k / T), r_t = Lbar_t(p - 1) / Lbar_t(p - 2)
  where Lbar_t(p) is task t's average loss over period p; weights 1 during the first two periods.
  The paper's period is an epoch; here it is a ``window`` of steps (calls to ``forward``). As
  LibMTL's ``DWA`` and torchjd's ``scalarization.DWA``.

The common interface (an ``nn.Module``): ``forward(losses)`` with ``losses`` a dict task -> scalar
loss (the tasks of the step, in their order) returns ``(total, weighted)``, the step's loss and
the dict of each task's weighted term (``total = sum(weighted.values())``, python's sum from 0;
these are the per-task losses ``aggregation.aggregated_backward`` takes); ``weights()`` returns
each task's current weight as a float, for logging; ``state_dict`` / ``load_state_dict`` hold
everything a bit-identical resume needs (the learned s_t; DWA's loss history, in buffers).
``build_weighting`` builds one from the command's settings.

The tests compare with torchjd's scalarizers and LibMTL's weightings, and with the formulas above
written out (tests/multitask/test_weighting.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..errors import UsageError

WEIGHTINGS = ("fixed", "uncertainty", "dwa")


class LossWeighting(nn.Module):
    """What the weightings share: the task names, in order, and the check of a step's losses."""

    def __init__(self, tasks):
        super().__init__()
        self.tasks = tuple(tasks)
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must be distinct names, at least one: {self.tasks}")

    def _check(self, losses: dict) -> None:
        unknown = [t for t in losses if t not in self.tasks]
        if unknown:
            raise ValueError(f"losses of tasks {unknown} that the weighting does not know ({list(self.tasks)})")

    def weights(self) -> dict[str, float]:
        raise NotImplementedError


class FixedWeighting(LossWeighting):
    """total = sum_t w_t L_t with constant weights, the report's sum of the heads' losses.

    ``weights``: task -> w_t (e.g. {'sst': 5, 'qqp': 20, 'sts': 1}). Input: ``losses``, task -> a
    scalar loss, any subset of the tasks. Output: (total, {task: w_t L_t}); total is
    ``sum(w[t] * losses[t] for t in losses)``, so a run weighs its losses bit for bit as before."""

    def __init__(self, weights: dict):
        super().__init__(weights)
        self.fixed = {t: float(w) for t, w in weights.items()}

    def forward(self, losses: dict) -> tuple[Tensor, dict]:
        self._check(losses)
        weighted = {t: self.fixed[t] * losses[t] for t in losses}
        return sum(weighted[t] for t in losses), weighted

    def weights(self) -> dict[str, float]:
        return dict(self.fixed)

    def extra_repr(self) -> str:
        return f"weights={self.fixed}"


class UncertaintyWeighting(LossWeighting):
    """Kendall, Gal & Cipolla 2018, in LibMTL's and torchjd's form: the weighted term of task t is
    exp(-s_t) L_t / 2 + s_t / 2, with s_t = log sigma_t^2 learned (``log_var`` [K], one per task
    in the order of ``tasks``, starting at ``log_var_init``).

    Input: ``losses``, task -> scalar loss. Output: (their sum, {task: its term}). ``weights()``:
    exp(-s_t) / 2, the factor on L_t. ``log_var`` is an ``nn.Parameter``: give ``parameters()``
    to the run's optimizer (without weight decay, which would pull every s_t to 0)."""

    def __init__(self, tasks, log_var_init: float = 0.0):
        super().__init__(tasks)
        self.log_var = nn.Parameter(torch.full((len(self.tasks),), float(log_var_init)))
        self.index = {t: i for i, t in enumerate(self.tasks)}

    def forward(self, losses: dict) -> tuple[Tensor, dict]:
        self._check(losses)
        weighted = {}
        for t, loss in losses.items():
            s = self.log_var[self.index[t]]
            weighted[t] = 0.5 * torch.exp(-s) * loss + 0.5 * s
        return sum(weighted[t] for t in losses), weighted

    def weights(self) -> dict[str, float]:
        factors = (0.5 * torch.exp(-self.log_var.detach())).tolist()
        return dict(zip(self.tasks, factors))


class DynamicWeightAverage(LossWeighting):
    """Liu, Johns & Davison 2019 (DWA), over periods of ``window`` steps instead of epochs.

    lambda_t = K softmax(r / T)_t with r_t = Lbar_t(p - 1) / Lbar_t(p - 2), the ratio of task t's
    average (unweighted) loss over the last two finished periods; every lambda_t is 1 until two
    periods have finished. A task without a loss in a period keeps its previous average there (and
    one never seen yet has no rate: r_t = 1). Each call to ``forward`` is one step: it weighs the
    losses with the current lambda, then adds them to the period's averages.

    Input: ``losses``, task -> scalar loss. Output: (sum_t lambda_t L_t, {task: lambda_t L_t}).
    ``temperature``: T (2 in the paper). The period's sums and the last two averages are buffers,
    so ``state_dict`` resumes mid-period."""

    def __init__(self, tasks, temperature: float = 2.0, window: int = 100):
        super().__init__(tasks)
        self.temperature = float(temperature)
        self.window = int(window)
        k = len(self.tasks)
        self.index = {t: i for i, t in enumerate(self.tasks)}
        self.register_buffer("loss_sum", torch.zeros(k))  # this period's sums of each task's losses
        self.register_buffer("loss_count", torch.zeros(k, dtype=torch.long))
        self.register_buffer("step_in_period", torch.zeros((), dtype=torch.long))
        self.register_buffer("periods", torch.zeros((), dtype=torch.long))  # finished periods
        self.register_buffer("averages", torch.full((2, k), math.nan))  # [older, newer] finished periods

    def lambdas(self) -> Tensor:
        """The current weights [K], in the order of ``tasks``."""
        if int(self.periods) < 2:
            return torch.ones(len(self.tasks), device=self.averages.device)
        rates = torch.nan_to_num(self.averages[1] / self.averages[0], nan=1.0)
        return len(self.tasks) * F.softmax(rates / self.temperature, dim=0)

    def forward(self, losses: dict) -> tuple[Tensor, dict]:
        self._check(losses)
        lam = self.lambdas()
        weighted = {t: lam[self.index[t]] * losses[t] for t in losses}
        total = sum(weighted[t] for t in losses)
        with torch.no_grad():
            for t, loss in losses.items():
                self.loss_sum[self.index[t]] += loss.detach().to(self.loss_sum.dtype)
                self.loss_count[self.index[t]] += 1
            self.step_in_period += 1
            if int(self.step_in_period) == self.window:
                self._finish_period()
        return total, weighted

    def _finish_period(self) -> None:
        seen = self.loss_count > 0
        average = torch.where(seen, self.loss_sum / self.loss_count.clamp(min=1), self.averages[1])
        self.averages.copy_(torch.stack([self.averages[1], average]))
        self.periods += 1
        self.loss_sum.zero_()
        self.loss_count.zero_()
        self.step_in_period.zero_()

    def weights(self) -> dict[str, float]:
        return dict(zip(self.tasks, self.lambdas().tolist()))

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, window={self.window}"


#: The settings each weighting takes, with their defaults.
SETTINGS = {"fixed": {}, "uncertainty": {"log_var_init": 0.0}, "dwa": {"temperature": 2.0, "window": 100}}


def build_weighting(name: str, tasks, fixed_weights: dict | None = None, **settings) -> LossWeighting:
    """The weighting ``name`` (``WEIGHTINGS``) over ``tasks`` (names, in order). ``fixed_weights``
    (task -> weight) is what ``fixed`` uses; the others do not read it. ``settings``: those of
    ``SETTINGS[name]``. An unknown name or setting, or a bad value, is a UsageError."""
    if name not in WEIGHTINGS:
        raise UsageError(f"unknown loss weighting {name!r}; choose one of: {', '.join(WEIGHTINGS)}")
    tasks = tuple(tasks)
    unknown = sorted(set(settings) - set(SETTINGS[name]))
    if unknown:
        known = ", ".join(SETTINGS[name]) or "none"
        raise UsageError(f"loss weighting {name} has no setting {unknown[0]!r} (its settings: {known})")
    values = SETTINGS[name] | settings
    if name == "fixed":
        weights = dict(fixed_weights or {})
        missing = [t for t in tasks if t not in weights]
        if missing:
            raise UsageError(f"loss weighting fixed needs a weight for task {missing[0]}")
        for t in tasks:
            w = weights[t]
            if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise UsageError(f"the weight of task {t} must be a finite number >= 0, not {w!r}")
        return FixedWeighting({t: weights[t] for t in tasks})
    if name == "uncertainty":
        init = values["log_var_init"]
        if not isinstance(init, (int, float)) or not math.isfinite(init):
            raise UsageError(f"log_var_init must be a finite number, not {init!r}")
        return UncertaintyWeighting(tasks, log_var_init=init)
    temperature, window = values["temperature"], values["window"]
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
        raise UsageError(f"the DWA temperature must be a finite number > 0, not {temperature!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise UsageError(f"the DWA window must be a whole number of steps >= 1, not {window!r}")
    return DynamicWeightAverage(tasks, temperature=temperature, window=window)
