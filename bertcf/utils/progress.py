"""A training run's progress on stderr: a tqdm bar on a terminal, plain lines everywhere else.

Under nohup, a batch scheduler or ``> log 2>&1`` a redrawn bar is carriage-return noise (a
400-step run left 47 KB of it). So ``--progress auto`` (the default) draws the bar only when
stderr is a terminal; otherwise it writes one line at each evaluation and one at every tenth of
the run, as Hugging Face's Trainer logs:

    mirror-run: step 500/5000 (10%), loss 0.4123, 5.1 steps/s, 0:01:38 elapsed, ~0:14:42 left
    mirror-run: step 500/5000, eval sts_spearman 0.7410 (best 0.7410 at step 500), 0:01:52 elapsed

``bar`` and ``lines`` force one or the other, ``none`` shows nothing.
"""
from __future__ import annotations

import sys
import time
from datetime import timedelta

from tqdm.auto import tqdm

MODES = ("auto", "bar", "lines", "none")
MARKS = 10  # lines mode: a line at every tenth of the run


def resolve(mode: str, stream=None) -> str:
    """``auto`` -> ``bar`` on a terminal, ``lines`` otherwise; the other modes as they are."""
    if mode != "auto":
        return mode
    stream = stream or sys.stderr
    return "bar" if hasattr(stream, "isatty") and stream.isatty() else "lines"


def clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class Progress:
    """The progress of steps ``initial`` .. ``total`` of the run called ``name``.

    ``step(n)`` after each optimiser step, ``loss(value)`` when a training loss is logged,
    ``evaluated(step, metric, value, best, best_step)`` after each evaluation (the bar shows the
    newest evaluation at once), ``close()`` at the end. ``enabled`` False (ranks other than 0)
    shows nothing."""

    def __init__(self, mode: str, name: str, total: int, initial: int = 0, enabled: bool = True):
        self.mode = resolve(mode) if enabled else "none"
        self.name, self.total, self.initial = name, total, initial
        self.started = time.perf_counter()
        self.last_loss = None
        self.postfix = {}
        self.next_mark = self._mark_after(initial)
        self.bar = (tqdm(total=total, initial=initial, desc=name, dynamic_ncols=True) if self.mode == "bar"
                    else None)

    def _mark_after(self, step: int) -> int:
        """The first tenth of the run after ``step``."""
        tenth = max(1, self.total // MARKS)
        return (step // tenth + 1) * tenth

    def _timing(self, step: int) -> tuple[float, float]:
        """(seconds since this process started the run, steps a second)."""
        elapsed = time.perf_counter() - self.started
        return elapsed, (step - self.initial) / max(elapsed, 1e-9)

    def step(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(1)
        elif self.mode == "lines" and (step >= self.next_mark or step == self.total):
            self.next_mark = self._mark_after(step)
            elapsed, rate = self._timing(step)
            loss = f", loss {self.last_loss:.4f}" if self.last_loss is not None else ""
            left = f", ~{clock((self.total - step) / rate)} left" if rate > 0 and step < self.total else ""
            print(f"{self.name}: step {step}/{self.total} ({100 * step / self.total:.0f}%){loss}, "
                  f"{rate:.1f} steps/s, {clock(elapsed)} elapsed{left}", file=sys.stderr, flush=True)

    def loss(self, value: float) -> None:
        self.last_loss = value
        if self.bar is not None:
            self.postfix["loss"] = f"{value:.4f}"
            self.bar.set_postfix(self.postfix)

    def evaluated(self, step: int, metric: str, value: float, best: float, best_step) -> None:
        if self.bar is not None:
            self.postfix[metric] = f"{value:.4f}"
            self.bar.set_postfix(self.postfix)
        elif self.mode == "lines":
            elapsed, _ = self._timing(step)
            print(f"{self.name}: step {step}/{self.total}, eval {metric} {value:.4f} (best {best:.4f} at step "
                  f"{best_step}), {clock(elapsed)} elapsed", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
