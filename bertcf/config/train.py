"""The run's settings (``TrainConfig``): how long and how fast to train, what to keep and where;
the same for every objective and every training command."""
from __future__ import annotations

from dataclasses import dataclass

from .. import runs
from ..cli import AT_LEAST_0, AT_LEAST_1, NON_NEGATIVE, POSITIVE
from ..settings import Settings, option
from ..utils.precision import resolve_device, resolve_precision
from ..utils.progress import MODES as PROGRESS_MODES

PRECISIONS = ("bf16", "fp16", "fp32")
BATCH_SAMPLERS = ("random", "no-duplicates")
LR_SCHEDULES = ("constant", "linear")


@dataclass(frozen=True)
class TrainConfig(Settings):
    """What every training run is given: its length, batch, optimiser and schedule, evaluation,
    checkpoints, seed, device and precision, and its directory. ``Trainer`` reads it; the training
    commands build it from their flags (a command may give a field another default)."""

    GROUP = "training"

    out_dir: str | None = option(None, "run directory (default runs/<stage>-<method>-<time>)")
    steps: int = option(10_000, "optimiser steps", type=AT_LEAST_1)
    batch_size: int = option(16, "global batch size", type=AT_LEAST_1)
    lr: float = option(1e-4, "AdamW's learning rate", type=POSITIVE)
    weight_decay: float = option(0.01, "AdamW's weight decay", type=NON_NEGATIVE)
    warmup_steps: int = option(0, "steps of linear learning-rate warm-up", type=AT_LEAST_0)
    lr_schedule: str = option("constant", "constant (the CS224N starter's) or linear decay to 0 after warm-up",
                              choices=LR_SCHEDULES)
    max_grad_norm: float = option(0.0, "clip gradients to this norm (0: off)", type=NON_NEGATIVE)
    eval_every: int = option(250, "steps between evaluations (each may write best/; each writes last/)",
                             type=AT_LEAST_1)
    save_every: int | None = option(None, "steps between writes of last/, the checkpoint --resume continues from, "
                                          "without evaluating (default: --eval-every)", type=AT_LEAST_1)
    log_every: int = option(10, "steps between logged training scalars", type=AT_LEAST_1)
    patience: int | None = option(None, "early stopping: end the run after this many evaluations without a better "
                                        "selection metric (best/ is kept as it is; default: train every step)",
                                  type=AT_LEAST_1)
    max_length: int = option(32, "tokens per sentence after truncation", type=AT_LEAST_1)
    batch_sampler: str | None = option(None, "random: each epoch a seeded permutation of the examples; no-duplicates: "
                                             "the same, but no text twice in a batch (default: no-duplicates for the "
                                             "objectives whose in-batch negatives a repeated text would make false, "
                                             "supervised SimCSE's NLI premises; random for the others)",
                                       choices=BATCH_SAMPLERS)
    seed: int = option(11711, "seed of every random draw (data order, dropout, masks)", type=int)
    device: str | None = option(None, "cpu, cuda, cuda:N (default: cuda when available)")
    precision: str | None = option(None, "autocast precision (default: bf16 on a GPU that supports it, else fp32)",
                                   choices=PRECISIONS)
    progress: str = option("auto", "a tqdm bar (on a terminal, with auto), plain lines at each evaluation and every "
                                   "tenth of the run (in a log file, with auto), or none", choices=PROGRESS_MODES)
    compile: bool = option(False, "wrap the encoder with torch.compile", switch=True)
    resume: bool = option(False, "continue the run in --out-dir from its last/ checkpoint", switch=True)

    def on_device(self):
        """This config with its device and precision resolved (cuda when available; bf16 on a GPU
        that supports it, else fp32): what config.json records and the run uses."""
        device = str(resolve_device(self.device))
        return self.replace(device=device, precision=resolve_precision(self.precision, device))

    def resolved(self, run_name: tuple[str, str], no_duplicates: bool | None):
        """This config with every default that depends on the machine or the objective filled in:
        the device and precision (``on_device``), ``out_dir`` (runs/<stage>-<method>-<time>, from
        ``run_name``), and ``batch_sampler`` (``default_batch_sampler`` of the objective's
        ``no_duplicates``; None: a mixture, whose parts each keep their own). The one place these
        defaults are taken: a command resolves its config with it once, and the ``Trainer`` gets
        that config back unchanged (every field already set), or resolves a Python user's here."""
        on_device = self.on_device()  # it checks a given device, and fills in what is not given
        config = self if on_device == self else on_device
        changes = {}
        if config.out_dir is None:
            changes["out_dir"] = runs.default_out_dir(*run_name)
        if config.batch_sampler is None and no_duplicates is not None:
            changes["batch_sampler"] = default_batch_sampler(no_duplicates)
        return config.replace(**changes) if changes else config


def default_batch_sampler(no_duplicates: bool) -> str:
    """The data order an objective gets when none is asked for: no-duplicates for one whose in-batch
    negatives a repeated text would make false (``Objective.no_duplicates``), else random."""
    return "no-duplicates" if no_duplicates else "random"
