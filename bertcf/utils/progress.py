"""A training run's progress on stderr: a tqdm bar on a terminal, plain lines everywhere else.

Under nohup, a batch scheduler or ``> log 2>&1`` a redrawn bar is carriage-return noise (a
400-step run left 47 KB of it). So ``--progress auto`` (the default) draws the bar only when
stderr is a terminal; otherwise it writes one line at each evaluation and one at every tenth of
the run, as Hugging Face's Trainer logs:

    mirror-run: step 500/5000 (10%), loss 0.4123, 5.1 steps/s, 0:01:38 elapsed, ~0:14:42 left
    mirror-run: step 500/5000, eval sts_spearman 0.7410 (best 0.7410 at step 500), 0:01:52 elapsed

``bar`` and ``lines`` force one or the other, ``none`` shows nothing.

Every long loop of every command reports through this module, so a log file never holds a
carriage-return bar: a run's steps (``Progress``), and the other counted work, encoding
sentences, scoring pairs, downloading, generating queries (``Progress`` with a ``unit``, or
``track`` around a loop), whose lines read

    score qqp-dev: 1,280/3,954 pairs (32%), 61.0 pairs/s, 0:00:21 elapsed, ~0:00:44 left

A library function's ``show_progress_bar`` (True, False, or a mode) names its mode through
``mode_of``: True is ``auto``.
"""
from __future__ import annotations

import sys
import time
from datetime import timedelta

from tqdm.auto import tqdm

MODES = ("auto", "bar", "lines", "none")
MARKS = 10  # lines mode: a line at every tenth of the run
QUIET_SECONDS = 2.0  # auto's lines of counted work (not a run's steps): none before this, so quick work writes none


def resolve(mode: str, stream=None) -> str:
    """``auto`` -> ``bar`` on a terminal, ``lines`` otherwise; the other modes as they are."""
    if mode != "auto":
        return mode
    stream = stream or sys.stderr
    return "bar" if hasattr(stream, "isatty") and stream.isatty() else "lines"


def mode_of(show) -> str:
    """A ``show_progress_bar`` argument as a mode: True -> ``auto``, False or None -> ``none``, a mode
    as it is."""
    if isinstance(show, str):
        if show not in MODES:
            raise ValueError(f"progress takes {', '.join(MODES)}, not {show!r}")
        return show
    return "auto" if show else "none"


def clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def amount(n: float, unit: str) -> str:
    """``n`` of ``unit`` for a line: bytes in MB, anything else counted with thousands separators."""
    return f"{n / 2 ** 20:,.1f} MB" if unit == "B" else f"{n:,.0f}"


class Progress:
    """The progress of steps ``initial`` .. ``total`` of the run called ``name``.

    ``step(n)`` after each optimiser step, ``loss(value)`` when a training loss is logged,
    ``evaluated(step, metric, value, best, best_step)`` after each evaluation (the bar shows the
    newest evaluation at once), ``close()`` at the end. ``enabled`` False (ranks other than 0)
    shows nothing. ``unit`` other than ``step``: counted work (``pair``, ``sentence``, ``B`` for
    bytes), ``step(n)`` the count done so far or ``advance(n)`` n more; ``total`` None: a bar
    without an end, and no lines."""

    def __init__(self, mode: str, name: str, total: int | None, initial: int = 0, enabled: bool = True,
                 unit: str = "step"):
        self.mode = resolve(mode) if enabled else "none"
        self.quiet = mode == "auto" and unit != "step"  # lines asked for by name are written from the start
        self.name, self.total, self.initial, self.unit = name, total, initial, unit
        self.done = initial
        self.started = time.perf_counter()
        self.last_loss = None
        self.postfix = {}
        self.next_mark = self._mark_after(initial)
        # Counted work's bar goes when it is done (it may run under a run's bar: an evaluation's pairs).
        options = {} if unit == "step" else {"unit": unit, "unit_scale": unit == "B", "unit_divisor": 1024,
                                             "leave": False}
        self.bar = (tqdm(total=total, initial=initial, desc=name, dynamic_ncols=True, **options)
                    if self.mode == "bar" else None)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _mark_after(self, step: int) -> int | float:
        """The first tenth of the run after ``step`` (without a total: never)."""
        if not self.total:
            return float("inf")
        tenth = max(1, self.total // MARKS)
        return (step // tenth + 1) * tenth

    def _timing(self, step: int) -> tuple[float, float]:
        """(seconds since this process started the run, steps a second)."""
        elapsed = time.perf_counter() - self.started
        return elapsed, (step - self.initial) / max(elapsed, 1e-9)

    def step(self, step: int) -> None:
        """``step`` of ``total`` done (a count, not an increment)."""
        if self.bar is not None:
            self.bar.update(step - self.done)
        self.done = step
        if self.mode == "lines" and (step >= self.next_mark or step == self.total):
            self.next_mark = self._mark_after(step)
            if not self.quiet or time.perf_counter() - self.started >= QUIET_SECONDS:
                print(self._line(step), file=sys.stderr, flush=True)

    def advance(self, n: int = 1) -> None:
        """``n`` more done."""
        self.step(self.done + n)

    update = advance  # tqdm's name

    def _line(self, step: int) -> str:
        elapsed, rate = self._timing(step)
        left = f", ~{clock((self.total - step) / rate)} left" if rate > 0 and step < self.total else ""
        share = f"{100 * step / self.total:.0f}%" if self.total else "100%"
        if self.unit == "step":
            loss = f", loss {self.last_loss:.4f}" if self.last_loss is not None else ""
            return (f"{self.name}: step {step}/{self.total} ({share}){loss}, {rate:.1f} steps/s, "
                    f"{clock(elapsed)} elapsed{left}")
        per = f"{amount(rate, self.unit)}/s" if self.unit == "B" else f"{rate:,.1f} {self.unit}s/s"
        unit = "" if self.unit == "B" else f" {self.unit}s"
        return (f"{self.name}: {amount(step, self.unit)}/{amount(self.total, self.unit)}{unit} ({share}), {per}, "
                f"{clock(elapsed)} elapsed{left}")

    def loss(self, value: float) -> None:
        self.last_loss = value
        if self.bar is not None:
            self.postfix["loss"] = f"{value:.4f}"
            self.bar.set_postfix(self.postfix)

    def evaluated(self, step: int, metric: str, value: float, best: float, best_step) -> None:
        """After an evaluation: ``metric`` (``last_step``: a run without a score, whose latest
        evaluation is best/) at ``value``, the best so far."""
        if metric == "last_step":
            if self.mode == "lines":
                elapsed, _ = self._timing(step)
                print(f"{self.name}: step {step}/{self.total}, evaluated (no score: best/ is the latest "
                      f"evaluation), {clock(elapsed)} elapsed", file=sys.stderr, flush=True)
            return
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


def track(items, name: str, show="auto", total: int | None = None, unit: str = "step", size=None):
    """``items``, yielded one by one while their progress is shown (``show``: a mode, or True/False);
    ``size(item)``: how much of ``total`` an item is (default 1)."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    total = len(items) if total is None else total
    with Progress(mode_of(show), name, total, unit=unit) as shown:
        for item in items:
            yield item
            shown.advance(1 if size is None else size(item))
