"""A training run's progress on stderr: a tqdm bar on a terminal, plain lines everywhere else.

Under nohup, a batch scheduler or ``> log 2>&1`` a redrawn bar is carriage-return noise (a
400-step run left 47 KB of it). So ``--progress auto`` (the default) draws the bar only when
stderr is a terminal; otherwise it writes one line at each evaluation and one at every tenth of
the run, as Hugging Face's Trainer logs:

    mirror-run: step 500/5000 (10%), loss 0.4123, 5.1 steps/s, 0:01:38 elapsed, ~0:14:42 left
    mirror-run: step 500/5000, eval sts_spearman 0.7410 (best 0.7410 at step 500), evaluated in 0:00:14, 0:01:52 elapsed

A run's pace is measured on its steps alone: the evaluations and checkpoints between them are
left out, and so are its first ``WARMUP_STEPS`` steps (one-off costs: memory, lazy set-up); the
mean of the latest ``WINDOW_STEPS`` steps follows a run that speeds up or slows down. Under one
step a second the pace is written in seconds a step. The time left is the steps left at that
pace, plus the evaluations left at the mean cost of those so far (their checkpoints included),
plus ``finish`` evaluations' worth for the work after the last step (stage 3 scores its full dev
sets there). Before the pace is known (the first steps) a line gives neither.

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

import contextlib
import sys
import time
from collections import deque
from datetime import timedelta

from tqdm.auto import tqdm

MODES = ("auto", "bar", "lines", "none")
MARKS = 10  # lines mode: a line at every tenth of the run
QUIET_SECONDS = 2.0  # auto's lines of counted work (not a run's steps): none before this, so quick work writes none
WARMUP_STEPS = 1  # a run's first steps, left out of its pace (one-off costs: memory, lazy set-up)
WINDOW_STEPS = 50  # the pace is the mean of this many latest steps


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


def pace(seconds_per_step: float) -> str:
    """``5.1 steps/s``, or ``4.2 s/step`` under one step a second (never ``0.0 steps/s``)."""
    if seconds_per_step > 1:
        return f"{seconds_per_step:.1f} s/step"
    return f"{1 / max(seconds_per_step, 1e-9):.1f} steps/s"


def note(mode: str, text: str) -> None:
    """One line of ``text`` on stderr in ``mode`` (above a bar that is being drawn; nothing for ``none``)."""
    mode = resolve(mode)
    if mode == "bar":
        tqdm.write(text, file=sys.stderr)
    elif mode == "lines":
        print(text, file=sys.stderr, flush=True)


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
    without an end, and no lines. ``quiet``: lines only once the work has taken ``QUIET_SECONDS``
    (default: counted work in ``auto``).

    A run's steps (see the module's docstring for the pace and the time left): the loop wraps what
    is not a step in ``paused()`` and passes an evaluation's own seconds to ``evaluated``;
    ``evaluations``: the steps the run evaluates at; ``finish``: the work after the last step, in
    evaluations."""

    def __init__(self, mode: str, name: str, total: int | None, initial: int = 0, enabled: bool = True,
                 unit: str = "step", quiet: bool | None = None, evaluations=(), finish: float = 0.0):
        self.mode = resolve(mode) if enabled else "none"
        # lines asked for by name are written from the start
        self.quiet = mode == "auto" and unit != "step" if quiet is None else quiet
        self.name, self.total, self.initial, self.unit = name, total, initial, unit
        self.done = initial
        self.started = time.perf_counter()
        self.last_loss = None
        self.postfix = {}
        self.next_mark = self._mark_after(initial)
        self.evaluations, self.finish = list(evaluations), finish
        self._steps = deque(maxlen=WINDOW_STEPS)  # (seconds, steps) of the latest steps, pauses left out
        self._step_ended, self._paused = self.started, 0.0  # the latest step's end; pauses since
        self._overhead, self._evaluated, self._evaluating = 0.0, 0, 0.0  # pauses, evaluations, their own seconds
        # Counted work's bar goes when it is done (it may run under a run's bar: an evaluation's pairs).
        if unit == "step":
            # the bar's rate and time left are this class's (tqdm's would count the evaluations as steps)
            options = {"bar_format": "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{timing}{postfix}]"}
        else:
            options = {"unit": unit, "unit_scale": unit == "B", "unit_divisor": 1024, "leave": False}
        self.bar = (_Bar(self, total=total, initial=initial, desc=name, dynamic_ncols=True, **options)
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

    # -- a run's pace ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def paused(self):
        """Work between steps (an evaluation, a checkpoint): left out of the pace, counted as the
        evaluations' cost."""
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self._paused += spent
            self._overhead += spent

    def seconds_per_step(self) -> float | None:
        """The mean of the latest steps, pauses and the first ``WARMUP_STEPS`` left out (None
        before any step counts)."""
        steps = sum(n for _, n in self._steps)
        return sum(s for s, _ in self._steps) / steps if steps else None

    def seconds_left(self, step: int) -> float | None:
        """The steps left at the pace, the evaluations left at their mean cost so far, and
        ``finish`` evaluations' worth (None before the pace is known)."""
        per_step = self.seconds_per_step()
        if per_step is None:
            return None
        left = (self.total - step) * per_step
        if self._evaluated:
            evaluations = sum(s > step for s in self.evaluations)
            left += (evaluations * self._overhead + self.finish * self._evaluating) / self._evaluated
        return left

    def _pace_and_left(self, step: int) -> tuple[str, str]:
        """(``, 4.2 s/step``, ``, ~0:01:10 left``) for a line or the bar: empty before the pace is
        known, and no time left at the end."""
        per_step = self.seconds_per_step()
        if per_step is None:
            return "", ""
        left = self.seconds_left(step) if step < self.total else None
        return f", {pace(per_step)}", "" if left is None else f", ~{clock(left)} left"

    def step(self, step: int) -> None:
        """``step`` of ``total`` done (a count, not an increment)."""
        if self.unit == "step" and step > self.done:
            now = time.perf_counter()
            if self.done - self.initial >= WARMUP_STEPS:
                self._steps.append((now - self._step_ended - self._paused, step - self.done))
            self._step_ended, self._paused = now, 0.0
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
            per_step, left = self._pace_and_left(step)
            return f"{self.name}: step {step}/{self.total} ({share}){loss}{per_step}, {clock(elapsed)} elapsed{left}"
        per = f"{amount(rate, self.unit)}/s" if self.unit == "B" else f"{rate:,.1f} {self.unit}s/s"
        unit = "" if self.unit == "B" else f" {self.unit}s"
        return (f"{self.name}: {amount(step, self.unit)}/{amount(self.total, self.unit)}{unit} ({share}), {per}, "
                f"{clock(elapsed)} elapsed{left}")

    def loss(self, value: float) -> None:
        self.last_loss = value
        if self.bar is not None:
            self.postfix["loss"] = f"{value:.4f}"
            self.bar.set_postfix(self.postfix)

    def evaluated(self, step: int, metric: str, value: float, best: float, best_step,
                  seconds: float | None = None) -> None:
        """After an evaluation that took ``seconds``: ``metric`` (``last_step``: a run without a
        score, whose latest evaluation is best/) at ``value``, the best so far."""
        self._evaluated += 1
        self._evaluating += seconds or 0.0
        took = f", evaluated in {clock(seconds)}" if seconds is not None else ""
        if metric == "last_step":
            if self.mode == "lines":
                elapsed, _ = self._timing(step)
                print(f"{self.name}: step {step}/{self.total}, evaluated (no score: best/ is the latest "
                      f"evaluation){took}, {clock(elapsed)} elapsed", file=sys.stderr, flush=True)
            return
        if self.bar is not None:
            self.postfix[metric] = f"{value:.4f}"
            self.bar.set_postfix(self.postfix)
        elif self.mode == "lines":
            elapsed, _ = self._timing(step)
            print(f"{self.name}: step {step}/{self.total}, eval {metric} {value:.4f} (best {best:.4f} at step "
                  f"{best_step}){took}, {clock(elapsed)} elapsed", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Bar(tqdm):
    """A run's bar, its pace and time left taken from its ``Progress`` (``{timing}`` in the bar's
    format)."""

    def __init__(self, progress: Progress, *args, **kwargs):
        self.progress = progress
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self):
        step = getattr(self, "n", 0)
        return super().format_dict | {"timing": "".join(self.progress._pace_and_left(step))}


def track(items, name: str, show="auto", total: int | None = None, unit: str = "step", size=None):
    """``items``, yielded one by one while their progress is shown (``show``: a mode, or True/False);
    ``size(item)``: how much of ``total`` an item is (default 1)."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    total = len(items) if total is None else total
    with Progress(mode_of(show), name, total, unit=unit) as shown:
        for item in items:
            yield item
            shown.advance(1 if size is None else size(item))
