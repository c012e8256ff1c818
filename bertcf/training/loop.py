"""The training loop under every training run (``TrainingLoop``) and what it keeps: seeds, the
checkpoints (best/, last/, --resume) in the run directory (``bertcf.runs``); progress,
evaluation, non-finite losses and Ctrl-C. The optimiser is ``training.optim``, the data order
``training.sampler``.

Its users (``training.Trainer`` for an objective, multitask fine-tuning, the cross-encoder) set it
up alike: ``TrainingLoop`` takes their modules, the parameters AdamW trains (the optimiser and its
schedule come from the config), their data orders, ``evaluate(step)`` (returning metrics) and
``save_model(dir)``; ``TrainingLoop.fit`` their ``step_fn(step)`` (returning the loss and some
scalars to log), an optional ``after_step``, the update's ``backward`` (stage 3's methods; default
the loss's) and ``finish``, their work on best/ once a run ends unstopped; ``closing_line`` says
how it went.
"""
from __future__ import annotations

import contextlib
import math
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from minbert import CheckpointError

from ..errors import NonFiniteLossError, UsageError
from ..models.model_card import write_model_card
from ..runs import STATE_FILE, Run
from ..utils.distributed import dist_info, mean_over_ranks, seed_dropout
from ..utils.files import recover_dir, save_dir_atomic
from ..utils.memory import peak_memory_mb
from ..utils.progress import Progress
from .optim import make_optimizer, make_scheduler, plain_backward, update

#: The metric of a run without a score (no evaluator, ``--select-on last``): the step, so the latest
#: evaluation is best/; the summary's first and best scores are then None.
LAST_STEP = "last_step"
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


# ---- the loop ------------------------------------------------------------------------------------
def closing_line(summary: dict, label: str, run_dir, device=None) -> str:
    """A run's last line: the selection metric (``label``) at step 0 and at its best, where the
    best checkpoint is (without a metric, best/ is the last evaluation), and with the run's
    ``device``, its peak memory so far (``utils.memory.peak_memory_mb``: the end's scoring counts)."""
    def score(x):
        return "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"
    best = Path(run_dir) / "best"
    if summary["first"] is None and summary["best"] is None:
        line = f"best checkpoint (the last evaluation, step {summary['best_step']}): {best}"
    elif summary["best_step"] is None:  # every evaluation gave nan (e.g. constant cosines)
        line = f"{label}: step 0 {score(summary['first'])}; no best checkpoint written"
    else:
        line = (f"{label}: step 0 {score(summary['first'])}, best {score(summary['best'])} at step "
                f"{summary['best_step']}; best checkpoint: {best}")
    peaks = {} if device is None else peak_memory_mb(device)
    said = [f"{peaks[k]:,.0f} MiB {what}" for k, what in (("peak_rss_mb", "resident"),
                                                          ("peak_memory_mb", "allocated on the GPU")) if k in peaks]
    return line + (f"; peak memory {', '.join(said)}" if said else "")


def evaluation_steps(steps: int, eval_every: int) -> list[int]:
    """The steps a run of ``steps`` evaluates at: 0, every ``eval_every``, and the last."""
    return sorted({0, steps, *range(eval_every, steps + 1, eval_every)})


def stopped_line(signal_name: str | None, step: int, run_dir) -> str:
    """What a run stopped by a signal says: where its checkpoint is and how to go on."""
    if signal_name == "SIGINT":
        return (f"interrupted at step {step}: state saved in {run_dir / 'last'}; "
                f"continue with --resume --out-dir {run_dir}")
    return (f"stopped by {signal_name or 'a signal'} at step {step}; checkpoint in {run_dir / 'last'}; "
            f"continue with --resume --out-dir {run_dir}")


#: The signals that stop a run cleanly: the step is finished and last/ written (Ctrl-C; a batch
#: scheduler's SIGTERM before it preempts the job). The command then exits with 128 + the signal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class LossWatch:
    """The first non-finite or diverging loss of a run, kept on the device (no sync per step) until
    the loop checks it, before it logs or checkpoints, so last/ never holds weights that such a
    loss updated."""

    def __init__(self):
        self.bad = None  # (step, loss, limit), tensors

    def __call__(self, step: int, loss) -> None:
        if self.bad is None:
            self.bad = (torch.full((), -1, dtype=torch.long, device=loss.device), loss,
                        DIVERGENCE_FACTOR * loss.abs().clamp_min(1))
        bad_step, bad_loss, limit = self.bad
        first = (~torch.isfinite(loss) | (loss.abs() > limit)) & (bad_step < 0)
        self.bad = torch.where(first, step, bad_step), torch.where(first, loss, bad_loss), limit

    def raise_if_bad(self, last) -> None:
        """``NonFiniteLossError`` if a loss went bad; ``last``: the run's last/, the checkpoint kept."""
        bad_step, bad_loss, _ = self.bad
        if int(bad_step) < 0:
            return
        kept = f"keeping the last good checkpoint in {last}" if last.exists() else "no checkpoint written"
        diverging = (f" (diverging: over {DIVERGENCE_FACTOR:,} times the first step's)"
                     if math.isfinite(float(bad_loss)) else "")
        raise NonFiniteLossError(f"the loss became {float(bad_loss)} at step {int(bad_step)}{diverging}; "
                                 f"stopped, {kept} (try a lower --lr or --precision fp32)")


class TrainingLoop:
    """The training loop of every training run, on the settings of ``config`` (a ``TrainConfig``,
    or any config with its fields: stage 3's, the cross-encoder's).

    ``modules``: name -> nn.Module whose state dicts go into last/ (the encoder, heads, flow);
    ``parameters``: what AdamW trains (parameters, or groups with their own "lr": ``optim.make_optimizer``),
    with config's learning rate, weight decay and schedule (``optimizer``: another optimiser instead);
    ``samplers``: name -> a data order with state (``training.sampler``); ``metric``: the evaluate()
    key that picks best/ (higher is better); ``save_model(dir)`` writes the weights; ``evaluate(step)``
    returns metrics; ``items_per_step``: the sentences a step trains on, or a function of those
    trained so far where steps differ; ``extra_state``: more objects with state_dict/load_state_dict
    (a generator); ``upgrade_state``: applied to a resumed state before it is loaded, for names that
    changed since it was written; ``card``: writes best/'s model card, called as ``card(directory,
    run config, metric, score, step)`` (default: a sentence encoder's); ``finish_cost``: the work
    after the last step, in evaluations (stage 3's full scoring), for the time left."""

    def __init__(self, config, run: Run, modules: dict, parameters, samplers: dict, *, metric: str, save_model,
                 evaluate, items_per_step, optimizer=None, extra_state=None, upgrade_state=None, card=None,
                 finish_cost: float = 0.0):
        self.config, self.run = config, run
        self.modules, self.samplers = modules, samplers
        self.optimizer = optimizer or make_optimizer(parameters, config.lr, config.weight_decay, config.device)
        self.scheduler = make_scheduler(self.optimizer, config.lr_schedule, config.warmup_steps, config.steps)
        self.metric, self.save_model, self.evaluate = metric, save_model, evaluate
        self.items_done = items_per_step if callable(items_per_step) else lambda: self.step * items_per_step
        self.extra_state = extra_state or {}
        self.upgrade_state = upgrade_state
        self.card, self.finish_cost = card or write_model_card, finish_cost
        self.rank, self.world = dist_info()
        self.step, self.best, self.best_step, self.first_score = 0, -math.inf, None, None
        self.stale = 0  # evaluations since the best one (--patience)
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.precision == "fp16")
        self._stop = False
        self.stop_signal = None   # the name of the signal that stopped the run (SIGINT, SIGTERM)
        self._saving = False      # a checkpoint is being written: a second signal waits for it
        self.progress: Progress | None = None  # while fit runs

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"step": self.step, "best": self.best, "best_step": self.best_step, "first_score": self.first_score,
                "stale": self.stale,
                "modules": {k: m.state_dict() for k, m in self.modules.items()},
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "samplers": {k: s.state_dict() for k, s in self.samplers.items()},
                "extra": {k: s.state_dict() for k, s in self.extra_state.items()},
                "rng": rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.best, self.best_step = state["step"], state["best"], state["best_step"]
        self.first_score, self.stale = state["first_score"], state.get("stale", 0)  # none before --patience
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
        self.run.record()  # only now: a --resume refused on the way leaves the run's record as it was

    # -- evaluation ----------------------------------------------------------------------------------
    def _evaluate_and_keep_best(self) -> None:
        if self.rank == 0:
            started = time.perf_counter()
            metrics = self.evaluate(self.step)
            seconds = time.perf_counter() - started
            self.run.metrics(self.step, metrics)
            score = metrics[self.metric]
            if self.first_score is None:
                self.first_score = score
            self.stale += 1
            if score > self.best:
                self.best, self.best_step, self.stale = score, self.step, 0

                def write_best(tmp):
                    self.save_model(tmp)
                    self.card(tmp, self.run.config, self.metric, score, self.step)
                with self._checkpointing():
                    save_dir_atomic(self.run.dir / "best", write_best)
            if self.progress is not None:
                self.progress.evaluated(self.step, self.metric, score, self.best, self.best_step, seconds)
        if self.world > 1:
            torch.distributed.barrier()

    # -- the loop ------------------------------------------------------------------------------------
    def fit(self, step_fn, after_step=None, backward=plain_backward, finish=None) -> dict:
        """Run ``step_fn(step) -> (losses, scalars)`` until --steps, evaluating every --eval-every steps
        (and at 0 and at the end), writing last/ then and every --save-every steps. ``backward(losses,
        scaler) -> scalars`` fills the gradients (``optim.update``; stage 3's: ``StepMethods.backward``),
        its scalars logged with the step's; ``after_step()`` runs after every optimiser step (an EMA
        update). Ctrl-C or SIGTERM finishes the step, writes last/ and stops. ``finish(summary) ->
        summary``: the work on best/ after a run that was not stopped (rank 0; the other ranks wait
        for it). Returns a summary ("signal": the stopping signal's name, or None)."""
        config = self.config
        save_every = config.save_every or config.eval_every
        self.run.start(self.step)
        self.progress = Progress(config.progress, self.run.dir.name, config.steps, self.step, enabled=self.rank == 0,
                                 evaluations=evaluation_steps(config.steps, config.eval_every), finish=self.finish_cost)
        if self.step == 0 and self.first_score is None:
            with self.progress.paused():
                self._evaluate_and_keep_best()
        previous_handlers = {s: signal.signal(s, self._request_stop) for s in STOP_SIGNALS}
        self._tick, self._tick_items, interrupted = time.perf_counter(), self.items_done(), False
        watch = LossWatch()
        try:
            while self.step < config.steps:
                for m in self.modules.values():
                    m.train()
                seed_dropout(config.seed, self.step)
                loss, scalars = update(self.optimizer, self.scaler, lambda: step_fn(self.step), config.device,
                                       config.precision, config.max_grad_norm, backward)
                if after_step is not None:
                    after_step()
                self.scheduler.step()
                self.step += 1
                loss_d = loss.detach().float()
                watch(self.step, loss_d)
                log_now = self.step % config.log_every == 0 or self.step == config.steps
                # Under torchrun every rank gets the Ctrl-C or SIGTERM (torchrun forwards it), but not
                # at the same step: the ranks agree to stop at the logging interval (below), since a
                # rank that left the loop alone would leave the others waiting in a collective.
                stop = self._stop and self.world == 1
                if log_now or self.step % config.eval_every == 0 or stop:
                    # Checked before anything is logged or checkpointed, so last/ never holds
                    # weights updated by a non-finite loss.
                    watch.raise_if_bad(self.run.dir / "last")
                if log_now:
                    stop = self._log(loss_d, scalars) or stop
                self.progress.step(self.step)
                if self.step % config.eval_every == 0 or self.step == config.steps:
                    with self.progress.paused():  # not a step: left out of the pace
                        self._evaluate_and_keep_best()
                        self.save_last()
                    if self._out_of_patience():
                        break
                elif stop or self.step % save_every == 0:
                    with self.progress.paused():
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
            print(stopped_line(self.stop_signal, self.step, self.run.dir), file=sys.stderr)
        self.run.close()
        scored = self.metric != LAST_STEP  # without a score the latest evaluation is best/: no score to report
        summary = {"step": self.step, "first": self.first_score if scored else None,
                   "best": self.best if scored else None, "best_step": self.best_step,
                   "interrupted": interrupted, "signal": self.stop_signal if interrupted else None,
                   "stopped_early": self.step < config.steps and not interrupted}
        if finish is not None and not interrupted and self.rank == 0:
            summary = finish(summary)
        if self.world > 1:  # the ranks leave the process group together, not while rank 0 still writes
            torch.distributed.barrier()
        return summary

    def _out_of_patience(self) -> bool:
        """--patience P: whether the last P evaluations found no better score (rank 0 decides, every
        rank stops); says so in one line."""
        patience = getattr(self.config, "patience", None)
        stop = [bool(patience) and self.rank == 0 and self.stale >= patience]
        if self.world > 1:
            torch.distributed.broadcast_object_list(stop, src=0)
        if stop[0] and self.rank == 0:
            print(f"early stop at step {self.step}: no better {self.metric} in {patience} evaluations "
                  f"(--patience {patience}); best {self.best:.4f} at step {self.best_step}", file=sys.stderr)
        return stop[0]

    def _log(self, loss, scalars: dict) -> bool:
        """Log the step's loss and scalars; returns whether any rank was asked to stop. The only
        host-device synchronisation of the loop, once per logging interval. Under torchrun the
        losses are averaged over the ranks: the global batch's."""
        values = mean_over_ranks({"loss": loss, **scalars, "stop": float(self._stop)}, loss.device)
        stop = values.pop("stop") > 0
        elapsed = time.perf_counter() - self._tick
        items = self.items_done()
        rate = (items - self._tick_items) / max(elapsed, 1e-9)
        self._tick, self._tick_items = time.perf_counter(), items
        values |= {"lr": self.scheduler.get_last_lr()[0], "sentences_per_second": rate, **peak_memory_mb(loss.device)}
        self.run.scalars(self.step, values, prefix="train/")
        self.progress.loss(values["loss"])
        return stop

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
