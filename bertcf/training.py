"""What every training stage shares: flags, device and precision, the optimiser, a
resumable data order, the run directory (config.json, metrics.jsonl, TensorBoard),
atomic checkpoints, and the training loop itself (progress bar, evaluation, best/last,
non-finite losses, Ctrl-C, --resume).

A stage supplies three functions to ``Trainer.fit``: ``step_fn(step)`` returning the loss
and some scalars to log, ``evaluate(step)`` returning metrics, and ``save_model(dir)``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

STATE_FILE = "training_state.pt"


class UsageError(Exception):
    """A bad flag or setting: entry points print it as one line and exit with status 2."""


class NonFiniteLossError(Exception):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


# ---- command-line flags shared by every stage ---------------------------------------------
class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (and exit status 2), not the usage text."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def add_common_args(parser: argparse.ArgumentParser, **defaults) -> argparse.ArgumentParser:
    """The flags of DESIGN.md's 'Common flags'; a stage passes its own defaults."""
    d = dict(model="bert-base-uncased", steps=10_000, batch_size=16, lr=1e-4, eval_every=250,
             max_length=32, log_every=10) | defaults
    g = parser.add_argument_group("common")
    g.add_argument("--model", default=d["model"], help="Hugging Face BERT name or directory (default %(default)s)")
    g.add_argument("--init", default=None, help="start from this run directory or checkpoint instead of --model")
    g.add_argument("--data-dir", default="data", help="directory with the CS224N files (default %(default)s)")
    g.add_argument("--out-dir", default=None, help="run directory (default runs/<stage>-<method>-<time>)")
    g.add_argument("--steps", type=int, default=d["steps"])
    g.add_argument("--batch-size", type=int, default=d["batch_size"], help="global batch size")
    g.add_argument("--lr", type=float, default=d["lr"])
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--warmup-steps", type=int, default=0)
    g.add_argument("--lr-schedule", choices=("constant", "linear"), default="constant",
                   help="constant (the CS224N starter's) or linear decay to 0 after warm-up")
    g.add_argument("--max-grad-norm", type=float, default=0.0, help="clip gradients to this norm (0: off)")
    g.add_argument("--eval-every", type=int, default=d["eval_every"])
    g.add_argument("--log-every", type=int, default=d["log_every"], help="steps between logged training scalars")
    g.add_argument("--max-length", type=int, default=d["max_length"], help="tokens per sentence after truncation")
    g.add_argument("--seed", type=int, default=11711)
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    g.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default=None,
                   help="autocast precision (default: bf16 on a GPU that supports it, else fp32)")
    g.add_argument("--compile", action="store_true", help="wrap the encoder with torch.compile")
    g.add_argument("--resume", action="store_true", help="continue the run in --out-dir from its last/ checkpoint")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse flags; with --resume, settings not given on the command line come from the
    run's config.json, so a resumed run continues with the settings it started with."""
    args = parser.parse_args(argv)
    if args.resume:
        if not args.out_dir:
            raise UsageError("--resume needs --out-dir (the run directory to continue)")
        config = Path(args.out_dir) / "config.json"
        if not config.is_file():
            raise UsageError(f"--resume: {config} not found")
        saved = json.loads(config.read_text())
        known = {a.dest for a in parser._actions}
        parser.set_defaults(**{k: v for k, v in saved.items() if k in known})
        args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "eval_every", "max_length", "log_every"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.lr is not None and not args.lr > 0:
        raise UsageError(f"--lr must be positive, not {args.lr}")
    args.device = str(resolve_device(args.device))
    args.precision = resolve_precision(args.precision, args.device)
    return args


def run_main(main, argv=None) -> int:
    """Run an entry point: bad input is one line on stderr and exit status 2, no traceback."""
    from minbert import CheckpointError

    from .data import DataError
    try:
        main(argv)
        return 0
    except (UsageError, DataError, CheckpointError, NonFiniteLossError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (or a second one inside it)
        print("interrupted", file=sys.stderr)
        return 130


# ---- device, precision, seeds ----------------------------------------------------------------
def resolve_device(flag: str | None) -> torch.device:
    if flag is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(flag)
    except RuntimeError:
        raise UsageError(f"--device {flag!r} is not a device (try cpu or cuda)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but no CUDA GPU is available")
    return device


def resolve_precision(flag: str | None, device) -> str:
    device = torch.device(device)
    if flag is None:
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if flag == "fp16" and device.type != "cuda":
        raise UsageError("--precision fp16 needs a GPU (use bf16 or fp32 on the CPU)")
    return flag


def autocast(device, precision: str | None = None):
    """Autocast for the matrix work; losses, pooling and the flow cast to float32 themselves."""
    device = torch.device(device)
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


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
    parameters one by one: fused is 4x to 8x faster there, see docs/BENCHMARKS.md). Biases,
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


# ---- distributed helpers -----------------------------------------------------------------------
def dist_info() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torch.distributed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def seed_dropout(seed: int, step: int) -> None:
    """Under torchrun, reseed the global generator (dropout's) for this rank and step. Every rank
    seeds it alike from --seed, so row i of every rank would draw the same dropout masks; a seed
    made of (seed, step, rank) gives each rank its own stream and repeats exactly on --resume.
    In one process this does nothing: its stream stays --seed's, which --resume restores."""
    rank, world = dist_info()
    if world > 1:
        torch.manual_seed(((seed * 1_000_003 + step) * 4099 + rank) % 2**63)


def mean_over_ranks(values: dict, device) -> dict:
    """{name: scalar tensor or number} -> {name: float}, averaged over the ranks of the process
    group in one all_reduce (each rank's loss is its share of the global batch, so the mean is
    the global batch's); in one process, the values as they are. A host sync: call it at the
    logging interval only, and on every rank."""
    names = list(values)
    stacked = torch.stack([torch.as_tensor(values[k], dtype=torch.float32, device=device).reshape(()) for k in names])
    rank, world = dist_info()
    if world > 1:
        torch.distributed.all_reduce(stacked)
        stacked /= world
    return dict(zip(names, stacked.tolist()))


def local_slice(items: list, rank: int, world: int) -> list:
    """This rank's share of a global batch (contiguous, so rank r holds rows r*b/w ...)."""
    if len(items) % world:
        raise UsageError(f"batch size {len(items)} is not divisible by the {world} processes")
    per = len(items) // world
    return items[rank * per:(rank + 1) * per]


# ---- files -------------------------------------------------------------------------------------
def write_json_atomic(path, obj) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def save_dir_atomic(target, write) -> None:
    """Call ``write(tmp_dir)``, then swap the finished directory into place, so a crash or
    kill at any moment leaves either the old complete checkpoint or the new one."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.tmp")
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(target) -> Path:
    """If a kill fell between the two renames of save_dir_atomic, the old copy is complete."""
    target = Path(target)
    old = target.with_name(f".{target.name}.old")
    if not target.exists() and old.exists():
        os.replace(old, target)
    return target


def default_out_dir(stage: str, method: str) -> str:
    return str(Path("runs") / f"{stage}-{method}-{datetime.now():%Y%m%d-%H%M%S}")


class Run:
    """A run directory: config.json, metrics.jsonl, tb/ (TensorBoard). Only rank 0 writes."""

    def __init__(self, out_dir, config: dict, resume: bool = False):
        self.dir = Path(out_dir)
        self.resume = resume
        self.rank, _ = dist_info()
        self.writer = None
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
            lines = [l for l in path.read_text().splitlines() if l.strip() and json.loads(l)["step"] <= step]
            tmp = path.with_name(".metrics.jsonl.tmp")
            tmp.write_text("".join(l + "\n" for l in lines))
            os.replace(tmp, path)

    def scalars(self, step: int, values: dict, prefix: str = "") -> None:
        if self.writer is None:
            return
        for k, v in values.items():
            self.writer.add_scalar(f"{prefix}{k}", float(v), step)

    def histogram(self, step: int, name: str, values) -> None:
        if self.writer is not None:
            self.writer.add_histogram(name, values, step)

    def metrics(self, step: int, values: dict) -> None:
        """One line of metrics.jsonl (and the same numbers in TensorBoard under eval/)."""
        if self.writer is None:
            return
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in values.items()}}) + "\n")
        self.scalars(step, values, prefix="eval/")
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# ---- the loop ------------------------------------------------------------------------------------
class Trainer:
    """The training loop every stage uses.

    ``modules``: name -> nn.Module whose state dicts go into last/ (the encoder, heads, flow);
    ``samplers``: name -> EpochSampler; ``metric``: the evaluate() key that picks best/
    (higher is better)."""

    def __init__(self, args, run: Run, modules: dict, optimizer, scheduler, samplers: dict,
                 metric: str, save_model, evaluate, items_per_step: int, extra_state=None):
        self.args, self.run = args, run
        self.modules, self.optimizer, self.scheduler, self.samplers = modules, optimizer, scheduler, samplers
        self.metric, self.save_model, self.evaluate = metric, save_model, evaluate
        self.items_per_step = items_per_step
        self.extra_state = extra_state or {}  # objects with state_dict/load_state_dict (e.g. a torch.Generator wrapper)
        self.rank, self.world = dist_info()
        self.step, self.best, self.best_step, self.first_score = 0, -math.inf, None, None
        self.scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")
        self._stop = False
        self.last_metrics: dict = {}

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

    def save_last(self) -> None:
        if self.rank != 0:
            return
        state = self.state_dict()

        def write(tmp):
            self.save_model(tmp)
            torch.save(state, tmp / STATE_FILE)
        save_dir_atomic(self.run.dir / "last", write)

    def resume(self) -> None:
        last = recover_dir(self.run.dir / "last")
        if not (last / STATE_FILE).is_file():
            raise UsageError(f"--resume: {last} holds no training state to continue from")
        state = torch.load(last / STATE_FILE, map_location="cpu", weights_only=False)
        if set(state["modules"]) != set(self.modules):
            raise UsageError(f"--resume: {last / STATE_FILE} holds {', '.join(sorted(state['modules']))}, not "
                             f"{', '.join(sorted(self.modules))}: it was written by another version of this "
                             f"stage; start a new run")
        self.load_state_dict(state)

    # -- evaluation ----------------------------------------------------------------------------------
    def _evaluate_and_keep_best(self) -> None:
        if self.rank == 0:
            metrics = self.evaluate(self.step)
            self.last_metrics = metrics
            self.run.metrics(self.step, metrics)
            score = metrics[self.metric]
            if self.first_score is None:
                self.first_score = score
            if score > self.best:
                self.best, self.best_step = score, self.step
                save_dir_atomic(self.run.dir / "best", self.save_model)
        if self.world > 1:
            torch.distributed.barrier()

    # -- the loop ------------------------------------------------------------------------------------
    def fit(self, step_fn, after_step=None) -> dict:
        """Run ``step_fn(step) -> (loss, scalars)`` until --steps, evaluating every
        --eval-every steps (and at step 0 and at the end). ``after_step()``, when given, runs
        after every optimiser step (e.g. an EMA update). Returns a summary."""
        args = self.args
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.run.start(self.step)
        if self.step == 0 and self.first_score is None:
            self._evaluate_and_keep_best()
        previous_handler = signal.signal(signal.SIGINT, self._request_stop)
        bar = tqdm(total=args.steps, initial=self.step, desc=self.run.dir.name, disable=self.rank != 0,
                   dynamic_ncols=True)
        tick, tick_step, interrupted = time.perf_counter(), self.step, False
        bad_step = bad_loss = None  # the first non-finite loss, tracked on the device (no sync per step)
        try:
            while self.step < args.steps:
                for m in self.modules.values():
                    m.train()
                seed_dropout(args.seed, self.step)
                self.optimizer.zero_grad(set_to_none=True)
                with autocast(args.device, args.precision):
                    loss, scalars = step_fn(self.step)
                self.scaler.scale(loss).backward()
                if args.max_grad_norm > 0:
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                if after_step is not None:
                    after_step()
                self.scheduler.step()
                self.step += 1
                bar.update(1)
                loss_d = loss.detach().float()
                if bad_step is None:
                    bad_step, bad_loss = torch.full((), -1, dtype=torch.long, device=loss_d.device), loss_d
                first = ~torch.isfinite(loss_d) & (bad_step < 0)
                bad_step, bad_loss = torch.where(first, self.step, bad_step), torch.where(first, loss_d, bad_loss)
                log_now = self.step % args.log_every == 0 or self.step == args.steps
                # Under torchrun every rank gets the Ctrl-C (torchrun forwards it), but not at the
                # same step: the ranks agree to stop at the logging interval (below), since a rank
                # that left the loop alone would leave the others waiting in a collective.
                stop = self._stop and self.world == 1
                if log_now or self.step % args.eval_every == 0 or stop:
                    # Checked before anything is logged or checkpointed, so last/ never holds
                    # weights updated by a non-finite loss.
                    if int(bad_step) >= 0:
                        last = self.run.dir / "last"
                        kept = f"keeping the last good checkpoint in {last}" if last.exists() else "no checkpoint written"
                        raise NonFiniteLossError(f"the loss became {float(bad_loss)} at step {int(bad_step)}; "
                                                 f"stopped, {kept} (try a lower --lr or --precision fp32)")
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
                    postfix = {"loss": f"{loss_value:.4f}"}
                    if self.metric in self.last_metrics:
                        postfix[self.metric] = f"{self.last_metrics[self.metric]:.4f}"
                    bar.set_postfix(postfix)
                if self.step % args.eval_every == 0 or self.step == args.steps:
                    self._evaluate_and_keep_best()
                    self.save_last()
                elif stop:
                    self.save_last()
                if stop:
                    interrupted = True
                    break
        finally:
            bar.close()
            signal.signal(signal.SIGINT, previous_handler)
        if interrupted:
            if self.rank == 0:
                print(f"interrupted at step {self.step}: state saved in {self.run.dir / 'last'}; "
                      f"continue with --resume --out-dir {self.run.dir}", file=sys.stderr)
        self.run.close()
        return {"step": self.step, "first": self.first_score, "best": self.best, "best_step": self.best_step,
                "interrupted": interrupted}

    def _request_stop(self, signum, frame):
        if self._stop:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self._stop = True
        if self.rank == 0:
            when = "this step" if self.world == 1 else "the steps up to the next logging interval (--log-every)"
            print(f"\nCtrl-C: finishing {when} and saving last/ (press again to abort)", file=sys.stderr)



# ---- distributed training ------------------------------------------------------------------------
# Every entry point (run_pretrain.py, run_multitask.py) runs unchanged under ``torchrun
# --nproc_per_node N``: its main() calls run_distributed(train, args), which joins the process group
# (a no-op for a plain ``python`` launch) and leaves it at the end, and its train() wraps the modules
# whose forward the step calls with wrap_ddp() (keeping the unwrapped ones for evaluation,
# checkpoints and the Trainer's ``modules``). Every rank draws the same global batch from its
# EpochSampler, draws any random views of it
# (span masks, an objective's noise) for the whole batch from the same seeded generator, and keeps
# its rows with local_slice, so --batch-size stays the global batch and the data are one process's;
# the contrastive losses gather candidates from every rank themselves
# (bertcf.contrastive.gather_with_grad). Only rank 0 evaluates, logs and writes the run directory
# (Run, Trainer); the other ranks wait at a barrier meanwhile. Each rank draws its own dropout masks
# (seed_dropout). A Ctrl-C, which torchrun forwards to every rank, stops every rank at the same step.
def init_distributed(device=None, backend: str | None = None, timeout_s: float = 1800.0) -> torch.device:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT) and return this rank's device.

    ``device``: the --device flag (None, "cpu", "cuda", "cuda:N"). Under torchrun with CUDA every
    rank takes GPU LOCAL_RANK (an explicit index in the flag is ignored then, since one GPU per
    process is the only layout DDP supports here) and the backend is NCCL; on the CPU it is gloo.
    Without torchrun (WORLD_SIZE unset or 1), nothing is started and the resolved device is
    returned, so single-process runs need no special case."""
    import datetime

    device = resolve_device(None if device is None else str(device))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not torch.distributed.is_available():
        return device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) are visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if not torch.distributed.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return device


def is_main_process() -> bool:
    """True on rank 0 (and outside torch.distributed): the process that evaluates, logs and saves."""
    return dist_info()[0] == 0


def wrap_ddp(module: torch.nn.Module, device=None, find_unused_parameters: bool = True, **ddp_kwargs):
    """``module`` wrapped in DistributedDataParallel when torch.distributed is running with more
    than one process and the module has a trainable parameter; otherwise ``module`` itself.

    Keep the unwrapped module for state_dict / save_pretrained / the Trainer's ``modules``; call
    the returned object in the step (several calls before one backward are fine: two views,
    three tasks). Gradients are averaged over ranks; since every rank's loss is the mean over its
    local slice and the contrastive candidates are gathered with gradient, the update equals one
    process on the global batch (tests/test_distributed.py).

    ``find_unused_parameters=True`` (the default) is needed whenever a trainable parameter
    takes part in the forward but not in the loss, e.g. minBERT's pooler under mean or [CLS]
    pooling: without it DDP stops at step 2 ("Expected to have finished reduction"), and
    ``static_graph=True`` is worse (silently wrong gradients at step 2, an error at step 3).
    For speed, a stage may freeze what its loss never uses
    (``encoder.bert.pooler.requires_grad_(False)``) and pass ``find_unused_parameters=False``."""
    _, world = dist_info()
    if world == 1 or not any(p.requires_grad for p in module.parameters()):
        return module
    from torch.nn.parallel import DistributedDataParallel

    device = torch.device(device) if device is not None else next(module.parameters()).device
    device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=find_unused_parameters,
                                   **ddp_kwargs)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel and/or torch.compile wrappers."""
    while True:
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            module = module.module
        elif hasattr(module, "_orig_mod"):
            module = module._orig_mod
        else:
            return module


def run_distributed(train, args):
    """``train(args, device)`` inside the process group torchrun describes (none for a plain
    ``python`` launch), leaving the group afterwards whatever happens."""
    device = init_distributed(args.device)
    try:
        return train(args, device)
    finally:
        cleanup_distributed()


def cleanup_distributed() -> None:
    """Leave the process group (safe to call when none was started)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
