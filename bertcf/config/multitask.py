"""``run_multitask.py``'s settings (``MultitaskConfig``), resolved once by ``parse``: the flags (with
--resume, the run's config.json; with --predict-only, the data settings of the checkpoint's run),
the old ``--para-*`` names, the encoder to start from and the run directory."""
from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from .. import cli, runs
from ..data.tasks import SPLITS, TASK_FILES
from ..errors import UsageError
from ..models.multitask import PAIR_ENCODINGS, TASKS, renamed_from_para, resolve_checkpoint, run_dir_of
from .data import DataConfig
from .fields import Settings, derived, option, redefault
from .model import ModelConfig
from .train import TrainConfig

MARGIN = cli.checked(float, lambda v: -1 <= v < 1, "in [-1, 1)")  # h of y = max(cos, h)
#: Old flags (before QQP was called qqp) -> their names now.
RENAMED_FLAGS = {f"--para-{name}": f"--qqp-{name}" for name in ("dropout", "margin", "batch-size", "weight", *SPLITS)}


@dataclass(frozen=True)
class HeadsConfig(Settings):
    """The encoder to fine-tune and the three task heads on it."""

    GROUP = "model"
    encoder: str | None = option(None, "a pretraining run directory or checkpoint (flow included when it has one), or "
                                       "a Hugging Face BERT name or directory (default: --init, else --model)")
    freeze_encoder: bool = option(False, "train the heads only (encoder, flow and the encoder's linear head frozen)",
                                  switch=True)
    freeze_flow: bool = option(False, "with a flow or a linear head (whitening): keep them fixed, train the encoder",
                               switch=True)
    proj_dim: int = option(768, "output width of the QQP and STS heads", type=cli.AT_LEAST_1)
    sst_dropout: float = option(0.3, "dropout before the SST head", type=cli.PROBABILITY)
    qqp_dropout: float = option(0.0, "dropout before the QQP head", type=cli.PROBABILITY)
    sts_dropout: float = option(0.1, "dropout before the STS head", type=cli.PROBABILITY)
    qqp_margin: float = option(0.7, "h of the QQP hinge y = max(cos, h)", type=MARGIN)
    sts_margin: float = option(0.0, "h of the STS y = max(cos, h)", type=MARGIN)
    pair_encoding: str = option("bi", "the QQP and STS pairs: bi, each sentence encoded alone, the heads' cosine "
                                      "(the report's); cross, both read together ([CLS] s1 [SEP] s2 [SEP], token "
                                      "types), a linear head on the pooled [CLS]: a logit for QQP (binary cross-"
                                      "entropy), a score for STS (squared error); --proj-dim and the margins do not "
                                      "apply then", choices=PAIR_ENCODINGS)


@dataclass(frozen=True)
class TaskBatchesConfig(Settings):
    """What one step draws of each task, and how the three losses are summed."""

    GROUP = "multitask training"
    sst_batch_size: int = option(32, "SST sentences per step", type=cli.AT_LEAST_1)
    qqp_batch_size: int = option(96, "QQP pairs per step", type=cli.AT_LEAST_1)
    sts_batch_size: int = option(32, "STS pairs per step", type=cli.AT_LEAST_1)
    sst_weight: float = option(5.0, "weight of the SST loss in the sum", type=cli.NON_NEGATIVE)
    qqp_weight: float = option(20.0, "weight of the QQP loss in the sum", type=cli.NON_NEGATIVE)
    sts_weight: float = option(1.0, "weight of the STS loss in the sum", type=cli.NON_NEGATIVE)
    max_train_examples: int | None = option(None, "use the first N rows of each training file", type=cli.AT_LEAST_1)
    max_eval_examples: int | None = option(None, "evaluate during training on the first N rows of each dev file "
                                                 "(default all; the final metrics.json always uses all)",
                                           type=cli.AT_LEAST_1)


#: One setting per task file (``sst_train``, ``qqp_dev``, ...): its path, default the standard name in --data-dir.
TaskFilesConfig = make_dataclass(
    "TaskFilesConfig",
    [(f"{task}_{split}", "str | None", option(None, f"the {task.upper()} {split} file (default: "
                                                    f"DATA_DIR/{TASK_FILES[task, split]})", metavar="FILE"))
     for task in TASKS for split in SPLITS],
    bases=(Settings,), frozen=True, namespace={"GROUP": "files (default: the standard CS224N names in --data-dir)"})


@dataclass(frozen=True)
class PredictionConfig(Settings):
    GROUP = "prediction"
    predict_only: bool = option(False, "write predictions/ and metrics.json again from --checkpoint, without training",
                                switch=True)
    checkpoint: str | None = option(None, "--predict-only: a finished run directory (its best/) or a checkpoint "
                                          "directory; its run's data settings are used unless given, and the files go "
                                          "to that run directory unless --out-dir is given")


@dataclass(frozen=True)
class MultitaskConfig(PredictionConfig, TaskFilesConfig, TaskBatchesConfig, TrainConfig, DataConfig, HeadsConfig,
                      ModelConfig):
    """Every setting of a ``run_multitask.py`` run (the bases, one per concern, in --help's order
    reversed)."""

    pooling: str | None = redefault(ModelConfig, "pooling", help="default: the checkpoint's (mean); first-last-avg: "
                                                                  "the average of the first and the last layer's token "
                                                                  "means")
    steps: int = redefault(TrainConfig, "steps", 5000)
    lr: float = redefault(TrainConfig, "lr", 1e-5)
    batch_size: int = redefault(TrainConfig, "batch_size", 128, help="sentences per batch in evaluation and prediction "
                                                                     "(training: --sst/qqp/sts-batch-size)")
    eval_every: int = redefault(TrainConfig, "eval_every", 500)
    max_length: int = redefault(TrainConfig, "max_length", 128)
    out_dir: str | None = redefault(TrainConfig, "out_dir", help="run directory (default runs/multitask-<encoder>-"
                                                                 "<time>, <encoder> the name of --encoder's directory; "
                                                                 "--predict-only: the --checkpoint's run directory)")
    batch_sampler: str | None = redefault(TrainConfig, "batch_sampler", cli=False)  # each task has its own order
    command: str | None = derived(help="the command line that started the run")

    def task_file(self, task: str, split: str) -> str | None:
        """The --{task}-{split} flag's file (None: the standard name in --data-dir)."""
        return getattr(self, f"{task}_{split}")


#: The settings --predict-only takes from the run's config.json unless given on the command line.
PREDICT_SETTINGS = ("data_dir", "max_length", "batch_size", *(f"{t}_{s}" for t in TASKS for s in SPLITS))


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="run_multitask.py", description="Multitask fine-tuning behind run_multitask.py "
                                "(the report's sections 4.3 and 5.3): SST-5, QQP and STS on one encoder.")
    MultitaskConfig.add_arguments(parser)
    cli.add_renamed_flags(parser, RENAMED_FLAGS)
    return parser


def parse(argv=None) -> MultitaskConfig:
    """The run of ``argv``, resolved (see the module's docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.predict_only:
        if args.resume:
            raise UsageError("--predict-only and --resume exclude each other")
        if not args.checkpoint:
            raise UsageError("--predict-only needs --checkpoint DIR (a finished run directory)")
        found = runs.run_settings(run_dir_of(resolve_checkpoint(args.checkpoint)))
        if found:
            saved = found[1]
            if isinstance(saved, dict) and "sst_train" in saved:  # a multitask run's settings
                saved = renamed_from_para(saved)
                parser.set_defaults(**{k: saved[k] for k in PREDICT_SETTINGS if k in saved})
    elif args.checkpoint:
        raise UsageError("--checkpoint is for --predict-only (to start from a checkpoint, use --encoder)")
    config = MultitaskConfig(**vars(cli.parse_args(parser, argv, upgrade=renamed_from_para))).on_device()
    encoder = str(config.encoder or config.init or config.model)  # --encoder defaults to --init, else --model
    out_dir = config.out_dir
    if out_dir is None and not config.predict_only:
        out_dir = runs.default_out_dir("multitask", runs.model_name(encoder, "encoder"))
    return config.replace(encoder=encoder, out_dir=out_dir, command=cli.command_line("run_multitask.py", argv))
