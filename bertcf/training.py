"""The training loop of every training command (``Trainer``) and what it keeps: the optimiser and its
schedule, a resumable data order, seeds, the run directory (config.json, metrics.jsonl,
TensorBoard) and the checkpoints (best/, last/, --resume); progress bar, evaluation, non-finite
losses and Ctrl-C.

A command (pretraining, multitask) supplies three functions to ``Trainer.fit``: ``step_fn(step)``
returning the loss and some scalars to log, ``evaluate(step)`` returning metrics, and
``save_model(dir)``.
"""
from __future__ import annotations

import contextlib
import json
import math
import random
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from minbert import CheckpointError

from .distributed import dist_info, mean_over_ranks, seed_dropout
from .errors import NonFiniteLossError, UsageError
from .files import recover_dir, save_dir_atomic, write_json_atomic, write_text_atomic
from .model_card import write_model_card
from .precision import autocast
from .progress import Progress

STATE_FILE = "training_state.pt"
#: A loss whose size passes this many times its first step's (or 1, when that is smaller) is
#: diverging: the run stops as for a non-finite loss (e.g. a flow whose loss went from 0.1 to 3e26).
DIVERGENCE_FACTOR = 10_000


# ---- seeds -------------------------------------------------------------------------------------
def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- optimiser ---------------------------------------------------------------------------------
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


def update(optimizer, scaler, compute, device, precision: str, max_grad_norm: float = 0.0):
    """One optimiser step: ``compute() -> (loss, scalars)`` under autocast, the (scaled) backward,
    clipping to ``max_grad_norm`` (0: off), the step. Returns what ``compute`` returned. The
    Trainer's loop and the bench both step through here."""
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, precision):
        loss, scalars = compute()
    scaler.scale(loss).backward()
    if max_grad_norm > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss, scalars


# ---- a resumable data order ------------------------------------------------------------------
class EpochSampler:
    """An endless stream of indices into n items: a fresh seeded permutation every epoch.

    Its whole state is (epoch, position), so a resumed run reads exactly the examples an
    uninterrupted one would. Under DDP every rank draws the same global batch and keeps
    its own slice of it, so ``--batch-size`` stays the global batch."""

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        if n < 1:
            raise UsageError("no examples to train on")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    def _permutation(self):
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed + 1_000_003 * self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            take = min(k - len(out), self.n - self.position)
            out += self._order[self.position:self.position + take]
            self.position += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation()


# ---- the run directory -------------------------------------------------------------------------
def default_out_dir(stage: str, method: str) -> str:
    return str(Path("runs") / f"{stage}-{method}-{datetime.now():%Y%m%d-%H%M%S}")


class Run:
    """A run directory: config.json, metrics.jsonl, tb/ (TensorBoard). Only rank 0 writes."""

    def __init__(self, out_dir, config: dict, resume: bool = False):
        self.dir = Path(out_dir)
        self.config = config
        self.resume = resume
        self.rank, _ = dist_info()
        self.writer = None
        if self.dir.exists() and not self.dir.is_dir():
            raise UsageError(f"--out-dir {self.dir} is a file, not a directory")
        if self.rank != 0:
            return
        if not resume and ((self.dir / "last").exists() or (self.dir / "metrics.jsonl").exists()):
            raise UsageError(f"{self.dir} already holds a run: pass --resume to continue it, "
                             f"or choose another --out-dir")
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.dir / "config.json", config)

    def start(self, step: int) -> None:
        """Open TensorBoard at ``step``; a resumed run first drops what a killed run logged
        after the checkpoint it resumes from (TensorBoard events and metrics.jsonl lines)."""
        if self.rank != 0:
            return
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(self.dir / "tb"), purge_step=step if self.resume else None)
        if self.resume:
            self._truncate_metrics(step)

    def _truncate_metrics(self, step: int) -> None:
        path = self.dir / "metrics.jsonl"
        if path.exists():
            records = [r for r in read_metrics(path) if r["step"] <= step]
            write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))

    def scalars(self, step: int, values: dict, prefix: str = "") -> None:
        if self.writer is None:
            return
        for k, v in values.items():
            self.writer.add_scalar(f"{prefix}{k}", float(v), step)

    def histogram(self, step: int, name: str, values) -> None:
        if self.writer is not None:
            self.writer.add_histogram(name, values, step)

    def metrics(self, step: int, values: dict) -> None:
        """One line of metrics.jsonl (and the same numbers in TensorBoard under eval/). A value may
        be an interval [lo, hi]: a list in metrics.jsonl, NAME_lo and NAME_hi in TensorBoard."""
        if self.writer is None:
            return
        values = {k: [float(x) for x in v] if isinstance(v, (list, tuple)) else float(v) for k, v in values.items()}
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")
        scalars = {}
        for k, v in values.items():
            scalars |= {f"{k}_lo": v[0], f"{k}_hi": v[1]} if isinstance(v, list) else {k: v}
        self.scalars(step, scalars, prefix="eval/")
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path) -> list[dict]:
    """The records of a run's metrics.jsonl. A torn last line (a run killed, or a machine that lost
    power, while appending it) is dropped with a note; a damaged line before it means the file is
    not what the run wrote: CheckpointError naming the file and line."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line) if line.strip() else None
            if record is not None and not (isinstance(record, dict) and isinstance(record.get("step"), int)):
                raise ValueError("not a record with a step")
        except ValueError:
            if number == len(lines):
                print(f"note: {path}: its last line was cut off (the run stopped while writing it); dropped",
                      file=sys.stderr)
                break
            raise CheckpointError(f"{path} line {number} is not a metrics record (the file is damaged); "
                                  f"--resume cannot continue from it: delete that line, or start a new run") from None
        if record is not None:
            records.append(record)
    return records


# ---- the loop ------------------------------------------------------------------------------------
#: The signals that stop a run cleanly: the step is finished and last/ written (Ctrl-C; a batch
#: scheduler's SIGTERM before it preempts the job). The command then exits with 128 + the signal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Trainer:
    """The training loop of every training command.

    ``modules``: name -> nn.Module whose state dicts go into last/ (the encoder, heads, flow);
    ``samplers``: name -> EpochSampler; ``metric``: the evaluate() key that picks best/
    (higher is better); ``upgrade_state``: applied to a resumed state before it is loaded, for
    names that changed since it was written."""

    def __init__(self, args, run: Run, modules: dict, optimizer, scheduler, samplers: dict,
                 metric: str, save_model, evaluate, items_per_step: int, extra_state=None, upgrade_state=None):
        self.args, self.run = args, run
        self.modules, self.optimizer, self.scheduler, self.samplers = modules, optimizer, scheduler, samplers
        self.metric, self.save_model, self.evaluate = metric, save_model, evaluate
        self.items_per_step = items_per_step
        self.extra_state = extra_state or {}  # objects with state_dict/load_state_dict (e.g. a torch.Generator wrapper)
        self.upgrade_state = upgrade_state
        self.rank, self.world = dist_info()
        self.step, self.best, self.best_step, self.first_score = 0, -math.inf, None, None
        self.scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")
        self._stop = False
        self.stop_signal = None   # the name of the signal that stopped the run (SIGINT, SIGTERM)
        self._saving = False      # a checkpoint is being written: a second signal waits for it
        self.progress: Progress | None = None  # while fit runs

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"step": self.step, "best": self.best, "best_step": self.best_step, "first_score": self.first_score,
                "modules": {k: m.state_dict() for k, m in self.modules.items()},
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "samplers": {k: s.state_dict() for k, s in self.samplers.items()},
                "extra": {k: s.state_dict() for k, s in self.extra_state.items()},
                "rng": rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.best, self.best_step = state["step"], state["best"], state["best_step"]
        self.first_score = state["first_score"]
        for k, m in self.modules.items():
            m.load_state_dict(state["modules"][k])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        for k, s in self.samplers.items():
            s.load_state_dict(state["samplers"][k])
        for k, s in self.extra_state.items():
            s.load_state_dict(state["extra"][k])
        set_rng_state(state["rng"])

    @contextlib.contextmanager
    def _checkpointing(self):
        """A checkpoint is being written: a second stop signal is ignored until it is done."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    def save_last(self) -> None:
        if self.rank != 0:
            return
        state = self.state_dict()

        def write(tmp):
            self.save_model(tmp)
            torch.save(state, tmp / STATE_FILE)
        with self._checkpointing():
            save_dir_atomic(self.run.dir / "last", write)

    def resume(self) -> None:
        last = recover_dir(self.run.dir / "last")
        if not (last / STATE_FILE).is_file():
            raise UsageError(f"--resume: {self.run.dir} never reached its first checkpoint ({last / STATE_FILE} "
                             f"is missing); start it again without --resume, after deleting {self.run.dir} "
                             f"or with another --out-dir")
        try:
            state = torch.load(last / STATE_FILE, map_location="cpu", weights_only=False)
        except Exception as e:  # a truncated zip, a corrupt pickle
            raise CheckpointError(f"{last / STATE_FILE} is truncated or corrupt ({type(e).__name__}: "
                                  f"{str(e)[:120]}); --resume cannot continue from it") from None
        if self.upgrade_state is not None:
            state = self.upgrade_state(state)
        if set(state["modules"]) != set(self.modules):
            raise UsageError(f"--resume: {last / STATE_FILE} holds {', '.join(sorted(state['modules']))}, not "
                             f"{', '.join(sorted(self.modules))}: it was written by another version of this "
                             f"command; start a new run")
        try:
            self.load_state_dict(state)
        except RuntimeError as e:  # a module whose parameters changed since (missing or unexpected keys)
            raise UsageError(f"--resume: {last / STATE_FILE} does not fit this version's modules "
                             f"({' '.join(str(e).split())[:160]}); start a new run") from None

    # -- evaluation ----------------------------------------------------------------------------------
    def _evaluate_and_keep_best(self) -> None:
        if self.rank == 0:
            metrics = self.evaluate(self.step)
            self.run.metrics(self.step, metrics)
            score = metrics[self.metric]
            if self.first_score is None:
                self.first_score = score
            if score > self.best:
                self.best, self.best_step = score, self.step

                def write_best(tmp):
                    self.save_model(tmp)
                    write_model_card(tmp, self.run.config, self.metric, score, self.step)
                with self._checkpointing():
                    save_dir_atomic(self.run.dir / "best", write_best)
            if self.progress is not None:
                self.progress.evaluated(self.step, self.metric, score, self.best, self.best_step)
        if self.world > 1:
            torch.distributed.barrier()

    # -- the loop ------------------------------------------------------------------------------------
    def fit(self, step_fn, after_step=None) -> dict:
        """Run ``step_fn(step) -> (loss, scalars)`` until --steps, evaluating every
        --eval-every steps (and at step 0 and at the end) and writing last/ at each evaluation and
        every --save-every steps. ``after_step()``, when given, runs after every optimiser step
        (e.g. an EMA update). Ctrl-C or SIGTERM finishes the step, writes last/ and stops. Returns
        a summary ("signal": the stopping signal's name, or None)."""
        args = self.args
        save_every = getattr(args, "save_every", None) or args.eval_every
        self.run.start(self.step)
        self.progress = Progress(getattr(args, "progress", "auto"), self.run.dir.name, args.steps, self.step,
                                 enabled=self.rank == 0)
        if self.step == 0 and self.first_score is None:
            self._evaluate_and_keep_best()
        previous_handlers = {s: signal.signal(s, self._request_stop) for s in STOP_SIGNALS}
        tick, tick_step, interrupted = time.perf_counter(), self.step, False
        bad_step = bad_loss = None  # the first non-finite or diverging loss, on the device (no sync per step)
        try:
            while self.step < args.steps:
                for m in self.modules.values():
                    m.train()
                seed_dropout(args.seed, self.step)
                loss, scalars = update(self.optimizer, self.scaler, lambda: step_fn(self.step), args.device,
                                       args.precision, args.max_grad_norm)
                if after_step is not None:
                    after_step()
                self.scheduler.step()
                self.step += 1
                loss_d = loss.detach().float()
                if bad_step is None:
                    bad_step, bad_loss = torch.full((), -1, dtype=torch.long, device=loss_d.device), loss_d
                    limit = DIVERGENCE_FACTOR * loss_d.abs().clamp_min(1)
                first = (~torch.isfinite(loss_d) | (loss_d.abs() > limit)) & (bad_step < 0)
                bad_step, bad_loss = torch.where(first, self.step, bad_step), torch.where(first, loss_d, bad_loss)
                log_now = self.step % args.log_every == 0 or self.step == args.steps
                # Under torchrun every rank gets the Ctrl-C or SIGTERM (torchrun forwards it), but not
                # at the same step: the ranks agree to stop at the logging interval (below), since a
                # rank that left the loop alone would leave the others waiting in a collective.
                stop = self._stop and self.world == 1
                if log_now or self.step % args.eval_every == 0 or stop:
                    # Checked before anything is logged or checkpointed, so last/ never holds
                    # weights updated by a non-finite loss.
                    if int(bad_step) >= 0:
                        last = self.run.dir / "last"
                        kept = f"keeping the last good checkpoint in {last}" if last.exists() else "no checkpoint written"
                        diverging = (f" (diverging: over {DIVERGENCE_FACTOR:,} times the first step's)"
                                     if math.isfinite(float(bad_loss)) else "")
                        raise NonFiniteLossError(f"the loss became {float(bad_loss)} at step {int(bad_step)}"
                                                 f"{diverging}; stopped, {kept} (try a lower --lr or "
                                                 f"--precision fp32)")
                if log_now:
                    # The only host-device synchronisation of the loop, once per logging interval.
                    # Under torchrun the losses are averaged over the ranks: the global batch's.
                    values = mean_over_ranks({"loss": loss_d, **scalars, "stop": float(self._stop)}, loss_d.device)
                    stop = stop or values.pop("stop") > 0
                    loss_value = values["loss"]
                    elapsed = time.perf_counter() - tick
                    rate = (self.step - tick_step) * self.items_per_step / max(elapsed, 1e-9)
                    tick, tick_step = time.perf_counter(), self.step
                    values |= {"lr": self.scheduler.get_last_lr()[0], "sentences_per_second": rate}
                    self.run.scalars(self.step, values, prefix="train/")
                    self.progress.loss(loss_value)
                self.progress.step(self.step)
                if self.step % args.eval_every == 0 or self.step == args.steps:
                    self._evaluate_and_keep_best()
                    self.save_last()
                elif stop or self.step % save_every == 0:
                    self.save_last()
                if stop:
                    interrupted = True
                    break
        finally:
            self.progress.close()
            self.progress = None
            for s, handler in previous_handlers.items():
                signal.signal(s, handler)
        if interrupted and self.rank == 0:
            last = self.run.dir / "last"
            if self.stop_signal == "SIGINT":
                print(f"interrupted at step {self.step}: state saved in {last}; "
                      f"continue with --resume --out-dir {self.run.dir}", file=sys.stderr)
            else:
                print(f"stopped by {self.stop_signal or 'a signal'} at step {self.step}; "
                      f"checkpoint in {last}; continue with --resume --out-dir {self.run.dir}", file=sys.stderr)
        self.run.close()
        return {"step": self.step, "first": self.first_score, "best": self.best, "best_step": self.best_step,
                "interrupted": interrupted, "signal": self.stop_signal if interrupted else None}

    def _request_stop(self, signum, frame):
        name = signal.Signals(signum).name
        if self._stop:
            if self._saving:  # never abort a checkpoint half-written: the stop comes right after it
                return
            raise KeyboardInterrupt  # a second signal stops at once
        self._stop, self.stop_signal = True, name
        if self.rank == 0:
            when = "this step" if self.world == 1 else "the steps up to the next logging interval (--log-every)"
            what = "Ctrl-C" if name == "SIGINT" else name
            print(f"\n{what}: finishing {when} and saving last/ (a second signal aborts)", file=sys.stderr)
