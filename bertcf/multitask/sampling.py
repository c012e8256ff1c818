"""How tasks share the steps (``--task-sampling``), as the multitask literature samples them:

- ``all``: one batch of every task each step (the report's; the losses summed);
- ``round-robin``: one task a step, in turn;
- ``proportional``: one task a step, drawn with probability proportional to its training set's
  size (Sanh et al. 2019, "A Hierarchical Multi-task Approach", and the CS224N projects);
- ``temperature``: one task a step, with probability proportional to size^(1/T), as
  multilingual models sample languages (Arivazhagan et al. 2019; T = 1 is proportional, a
  large T nearly uniform);
- ``annealed``: one task a step, probability proportional to size^alpha with alpha going from
  1 (proportional) to 0.2 (near uniform) over training (Stickland & Murray 2019, "BERT and PALs",
  their "annealed sampling": alpha = 1 - 0.8 (e - 1) / (E - 1) over E epochs; here over the steps).

A draw depends only on the seed and the step (its own generator, seeded from both), so a resumed
run continues the same sequence; the batches each task got are counted (``counts``), saved with
the run and logged.
"""
from __future__ import annotations

import torch

from ..errors import UsageError

MODES = ("all", "round-robin", "proportional", "temperature", "annealed")


class TaskSampler:
    """Which tasks a step draws a batch of. ``sizes``: task -> training examples, in the tasks'
    order; ``steps``: the run's length (for ``annealed``); ``temperature``: T of ``temperature``."""

    def __init__(self, mode: str, sizes: dict, steps: int, seed: int, temperature: float = 2.0):
        if mode not in MODES:
            raise UsageError(f"--task-sampling must be one of {', '.join(MODES)}, not {mode!r}")
        if not temperature > 0:
            raise UsageError(f"--sampling-temperature must be positive, not {temperature}")
        self.mode, self.tasks, self.steps, self.seed = mode, list(sizes), steps, seed
        self.sizes = torch.tensor([float(sizes[t]) for t in self.tasks], dtype=torch.float64)
        self.temperature = temperature
        self.counts = dict.fromkeys(self.tasks, 0)

    def probabilities(self, step: int) -> torch.Tensor:
        """The chance of each task at ``step`` (float64 [tasks]); ``all`` and ``round-robin`` draw
        nothing (uniform is returned for them)."""
        if self.mode == "proportional":
            alpha = 1.0
        elif self.mode == "temperature":
            alpha = 1.0 / self.temperature
        elif self.mode == "annealed":
            alpha = 1.0 - 0.8 * step / max(1, self.steps - 1)
        else:
            return torch.full_like(self.sizes, 1.0 / len(self.tasks))
        weights = self.sizes ** alpha
        return weights / weights.sum()

    def tasks_at(self, step: int) -> list[str]:
        """The tasks of step ``step`` (counted)."""
        if self.mode == "all":
            chosen = list(self.tasks)
        elif self.mode == "round-robin":
            chosen = [self.tasks[step % len(self.tasks)]]
        else:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            chosen = [self.tasks[int(torch.multinomial(self.probabilities(step), 1, generator=g))]]
        for task in chosen:
            self.counts[task] += 1
        return chosen

    def state_dict(self) -> dict:
        return {"counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.counts = dict.fromkeys(self.tasks, 0) | {k: v for k, v in state["counts"].items() if k in self.counts}
