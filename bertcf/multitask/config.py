"""``run_multitask.py``'s settings (``MultitaskConfig``), resolved once by ``parse``: the flags (with
--resume, the run's config.json; with --predict-only, the data settings of the checkpoint's run),
the old ``--para-*`` names, the encoder to start from and the run directory. The tasks themselves
are declared by the built-in flags, --task-file and --task (``declarations.declared_tasks``)."""
from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from .. import cli, runs
from ..config.data import DataConfig
from ..config.model import ModelConfig
from ..config.train import TrainConfig
from ..errors import UsageError
from ..models.peft import PeftSettings
from ..settings import Settings, derived, option, redefault
from .aggregation import AGGREGATORS
from .legacy import RENAMED_FLAGS, renamed_from_para
from .model import PAIR_ENCODINGS, resolve_checkpoint, run_dir_of
from ..training.sampler import MODES
from .weighting import WEIGHTINGS
from .tasks import BUILTIN, REPORT, SPLITS
from ..data.tasks import TASK_FILES

MARGIN = cli.checked(float, lambda v: -1 <= v < 1, "in [-1, 1)")  # h of y = max(cos, h)


@dataclass(frozen=True)
class HeadsConfig(Settings):
    """The encoder to fine-tune and the heads of the built-in tasks on it."""

    GROUP = "model"
    encoder: str | None = option(None, "a pretraining run directory or checkpoint (flow included when it has one), or "
                                       "a Hugging Face BERT name or directory (default: --init, else --model)")
    freeze_encoder: bool = option(False, "train the heads only (encoder, flow and the encoder's linear head frozen)",
                                  switch=True)
    freeze_flow: bool = option(False, "with a flow or a linear head (whitening): keep them fixed, train the encoder",
                               switch=True)
    drop_flow: bool = option(False, "heads on f(x): leave the checkpoint's flow and linear head (whitening) out, "
                                    "fine-tune the encoder alone", switch=True)
    proj_dim: int = option(768, "the cosine heads' projection: each sentence vector of a pair encoded apart (QQP, "
                                "STS, a pair-ranking task) goes through a linear map to this width before the "
                                "cosine", type=cli.AT_LEAST_1)
    sst_dropout: float = option(REPORT["sst_dropout"], "dropout before the SST head", type=cli.PROBABILITY)
    qqp_dropout: float = option(REPORT["qqp_dropout"], "dropout before the QQP head", type=cli.PROBABILITY)
    sts_dropout: float = option(REPORT["sts_dropout"], "dropout before the STS head", type=cli.PROBABILITY)
    qqp_margin: float = option(REPORT["qqp_margin"], "h of the QQP hinge y = max(cos, h)", type=MARGIN)
    sts_margin: float = option(REPORT["sts_margin"], "h of the STS y = max(cos, h)", type=MARGIN)
    pair_encoding: str = option("bi", "the pair tasks: bi, each sentence encoded alone, the heads' cosine (the "
                                      "report's); cross, both read together ([CLS] s1 [SEP] s2 [SEP], token types), a "
                                      "linear head on the pooled [CLS]: a logit (two classes, binary cross-entropy), "
                                      "logits (more classes) or a score (squared error); --proj-dim and the margins "
                                      "do not apply then", choices=PAIR_ENCODINGS)


@dataclass(frozen=True)
class TaskBatchesConfig(Settings):
    """What one step draws of each built-in task, and the weights of their losses."""

    GROUP = "multitask training"
    sst_batch_size: int = option(REPORT["sst_batch_size"], "SST sentences per step", type=cli.AT_LEAST_1)
    qqp_batch_size: int = option(REPORT["qqp_batch_size"], "QQP pairs per step", type=cli.AT_LEAST_1)
    sts_batch_size: int = option(REPORT["sts_batch_size"], "STS pairs per step", type=cli.AT_LEAST_1)
    sst_weight: float = option(REPORT["sst_weight"], "weight of the SST loss in the sum", type=cli.NON_NEGATIVE)
    qqp_weight: float = option(REPORT["qqp_weight"], "weight of the QQP loss in the sum", type=cli.NON_NEGATIVE)
    sts_weight: float = option(REPORT["sts_weight"], "weight of the STS loss in the sum", type=cli.NON_NEGATIVE)
    max_train_examples: int | None = option(None, "use the first N rows of each training file", type=cli.AT_LEAST_1)
    max_eval_examples: int | None = option(None, "evaluate during training on N rows of each dev file, drawn "
                                                 "at random, the same rows in every run (default all; the "
                                                 "final metrics.json always uses all)",
                                           type=cli.AT_LEAST_1)
    keep_last: str = option("state", "what last/ keeps once the run has finished: state (its weights and the "
                                     "training state --resume continues from: optimiser, data order, RNG), weights "
                                     "(its weights alone), none (no last/; best/ and the predictions stay). Until "
                                     "then it keeps the state, for a run that stops",
                            choices=("state", "weights", "none"))


@dataclass(frozen=True)
class TasksConfig(Settings):
    """Which tasks run, and how they share the steps."""

    GROUP = "tasks"
    task_file: str | None = option(None, "a YAML or JSON file declaring tasks (docs/multitask.md has a complete "
                                         "example); a task named sst, qqp or sts there replaces the fields it gives",
                                   metavar="FILE")
    task: tuple | None = option(None, "tasks declared on the command line, each as key=value pairs: "
                                      "name=snli,kind=pair-classification,train=FILE,dev=FILE,"
                                      "text_columns=premise;hypothesis,num_classes=3 (several after one --task)",
                                nargs="+", metavar="DECLARATION")
    tasks: str | None = option(None, "the tasks to train, comma-separated (default: every declared task: sst, qqp, "
                                     "sts and those of --task-file and --task)")
    task_sampling: str = option("all", "how tasks share the steps: all (a batch of every task each step, the "
                                       "report's), round-robin, proportional (to training-set size), temperature "
                                       "(size^(1/T)), annealed (from proportional towards uniform; Stickland & "
                                       "Murray 2019)", choices=MODES)
    sampling_temperature: float = option(2.0, "T of --task-sampling temperature", type=cli.POSITIVE)
    conflict_every: int = option(100, "every N steps, log the cosine between each pair of tasks' gradients on the "
                                      "encoder (TensorBoard conflict/; 0: never). Costs one backward pass per task "
                                      "at those steps", type=cli.checked(int, lambda v: v >= 0, "an integer >= 0"))


@dataclass(frozen=True)
class MethodsConfig(Settings):
    """The multitask-learning methods: how the tasks' gradients and losses combine."""

    GROUP = "multitask methods"
    aggregator: str = option("sum", "how the tasks' gradients on the shared encoder combine: sum (the report's: "
                                    "one backward of the weighted sum), or a torchjd aggregator (docs/multitask.md "
                                    "describes each); needs --task-sampling all", choices=tuple(AGGREGATORS))
    aggregator_gramian: bool = option(False, "with a Gramian-based --aggregator (upgrad, pcgrad, mgda, ...): its weights "
                                             "from the sum of the encoder parameters' Gramians, without the whole "
                                             "Jacobian at once (torchjd's optimize_gramian_computation: up to half its "
                                             "memory); the same update up to rounding, not bit for bit", switch=True)
    task_weighting: str = option("fixed", "the tasks' loss weights: fixed (the per-task weights), uncertainty "
                                          "(learned, Kendall et al. 2018), dwa (Dynamic Weight Average, Liu et al. "
                                          "2019)", choices=WEIGHTINGS)
    dwa_temperature: float = option(2.0, "T of --task-weighting dwa", type=cli.POSITIVE)
    dwa_window: int = option(50, "--task-weighting dwa: the steps whose mean loss makes one 'epoch' of the paper",
                             type=cli.AT_LEAST_1)
    smart_weight: float = option(0.0, "weight of the SMART regulariser (Jiang et al. 2020; 0: off)", type=cli.NON_NEGATIVE)
    smart_steps: int = option(1, "SMART: adversarial ascent steps on the perturbation", type=cli.AT_LEAST_1)
    smart_step_size: float = option(1e-3, "SMART: the ascent's step size", type=cli.POSITIVE)
    smart_epsilon: float = option(1e-6, "SMART: the perturbation's norm bound", type=cli.POSITIVE)
    smart_noise_var: float = option(1e-5, "SMART: the initial noise's variance", type=cli.POSITIVE)


#: One setting per built-in task file (``sst_train``, ``qqp_dev``, ...): its path, default the standard name in --data-dir.
TaskFilesConfig = make_dataclass(
    "TaskFilesConfig",
    [(f"{task}_{split}", "str | None", option(None, f"the {task.upper()} {split} file (default: "
                                                    f"DATA_DIR/{TASK_FILES[task, split]})", metavar="FILE"))
     for task in BUILTIN for split in SPLITS],
    bases=(Settings,), frozen=True, namespace={"GROUP": "files (default: the standard CS224N names in --data-dir)"})


@dataclass(frozen=True)
class PredictionConfig(Settings):
    GROUP = "prediction"
    predict_only: bool = option(False, "write predictions/ and metrics.json again from --checkpoint, without training",
                                switch=True)
    checkpoint: str | None = option(None, "--predict-only: a finished run directory (its best/) or a checkpoint "
                                          "directory; its run's data settings are used unless given, and the files go "
                                          "to that run directory unless --out-dir is given")
    prediction_labels: str = option("index", "a declared task with class names (labels): its prediction files hold "
                                             "the class index (index, as CS224N's files do) or the name (name)",
                                    choices=("index", "name"))


@dataclass(frozen=True)
class PeftScopeConfig(Settings):
    """Stage 3's adapters: one for every task, or one per task (the rest of --peft: models/peft.py)."""

    GROUP = PeftSettings.GROUP
    peft_scope: str = option("shared", "--peft: one adapter for all tasks (shared), or one per task beside a "
                                       "shared one (per-task: each task's rows pass through both; one encoder pass "
                                       "per task of a step)", choices=("shared", "per-task"))


@dataclass(frozen=True)
class MultitaskConfig(PredictionConfig, TaskFilesConfig, PeftScopeConfig, PeftSettings, MethodsConfig, TasksConfig,
                      TaskBatchesConfig, TrainConfig, DataConfig, HeadsConfig, ModelConfig):
    """Every setting of a ``run_multitask.py`` run (the bases, one per concern, in --help's order
    reversed); from Python, ``MultitaskConfig(steps=..., out_dir=..., aggregator="pcgrad", ...)``."""

    pooling: str | None = redefault(ModelConfig, "pooling", help="default: the checkpoint's (mean); first-last-avg: "
                                                                  "the average of the first and the last layer's token "
                                                                  "means")
    steps: int = redefault(TrainConfig, "steps", 5000)
    lr: float = redefault(TrainConfig, "lr", 1e-5)
    batch_size: int = redefault(TrainConfig, "batch_size", 128, help="sentences per batch in evaluation and prediction "
                                                                     "(training: each task's batch size)")
    eval_every: int = redefault(TrainConfig, "eval_every", 500)
    max_length: int = redefault(TrainConfig, "max_length", 128)
    out_dir: str | None = redefault(TrainConfig, "out_dir", help="run directory (default runs/multitask-<encoder>-"
                                                                 "<time>, <encoder> the name of --encoder's directory; "
                                                                 "--predict-only: the --checkpoint's run directory)")
    batch_sampler: str | None = redefault(TrainConfig, "batch_sampler", cli=False)  # each task has its own order
    command: str | None = derived(help="the command line that started the run")

    def __post_init__(self):
        super().__post_init__()
        if self.task is not None and not isinstance(self.task, tuple):
            object.__setattr__(self, "task", tuple(self.task))  # a list from the command line or config.json
        check_settings(self)

    def file_of(self, task: str, split: str) -> str | None:
        """The --{task}-{split} flag's file (None: the standard name in --data-dir)."""
        return getattr(self, f"{task}_{split}")


# ---- the settings' rules among themselves -------------------------------------------------------------
#: Settings that only one choice of another uses: setting -> (the setting that decides, the values it
#: applies with, as the refusal says it). Given otherwise, they are refused rather than recorded unused.
APPLIES_WITH = {
    "sampling_temperature": ("task_sampling", ("temperature",), "--task-sampling temperature"),
    "dwa_temperature": ("task_weighting", ("dwa",), "--task-weighting dwa"),
    "dwa_window": ("task_weighting", ("dwa",), "--task-weighting dwa"),
    **{name: ("smart_weight", None, "--smart-weight > 0")
       for name in ("smart_steps", "smart_step_size", "smart_epsilon", "smart_noise_var")},
}


def check_settings(config: MultitaskConfig) -> None:
    """The settings' rules among themselves, in one place (``MultitaskConfig`` checks them when it
    is made): UsageError, one line, for settings that exclude each other, one that needs another,
    and one given where it does not apply. The rules that involve the tasks are
    ``checks.check_run``'s."""
    check_prediction(config)
    if config.aggregator != "sum":
        if config.task_sampling != "all":
            raise UsageError(f"--aggregator {config.aggregator} combines the tasks' gradients of one step: it needs "
                             f"--task-sampling all, not {config.task_sampling}")
        if config.freeze_encoder:
            raise UsageError(f"--aggregator {config.aggregator} combines the tasks' gradients on the encoder, which "
                             f"--freeze-encoder freezes: there is nothing to aggregate; use --aggregator sum")
    if config.task_weighting != "fixed" and config.task_sampling != "all":
        raise UsageError(f"--task-weighting {config.task_weighting} weighs every task's loss each step: it needs "
                         f"--task-sampling all, not {config.task_sampling}")
    if config.peft and config.freeze_encoder:
        raise UsageError(f"--peft {config.peft} trains adapters in the encoder, --freeze-encoder trains none of it: "
                         f"give one of them")
    if config.peft_scope == "per-task":
        if not config.peft:
            raise UsageError("--peft-scope per-task gives each task a peft adapter of its own: it needs --peft")
        if config.merge:
            raise UsageError("--merge writes one plain encoder, --peft-scope per-task has one per task: give one "
                             "of them")
        if config.aggregator != "sum":
            raise UsageError(f"--aggregator {config.aggregator} combines the tasks' gradients on what they share, "
                             f"--peft-scope per-task gives each its own adapter: give one of them")
    if config.drop_flow and config.freeze_flow:
        raise UsageError("--drop-flow leaves the flow out, --freeze-flow keeps it fixed: give one of them")
    fields = MultitaskConfig.__dataclass_fields__
    for name, (decides, values, needed) in APPLIES_WITH.items():
        choice = getattr(config, decides)
        applies = choice in values if values is not None else choice > 0
        if getattr(config, name) != fields[name].default and not applies:
            flag = f"--{name.replace('_', '-')}"
            raise UsageError(f"{flag} does not apply without {needed} (--{decides.replace('_', '-')} is {choice}); "
                             f"leave {flag} out or give {needed}")


def check_prediction(settings) -> None:
    """--predict-only's rules (on the parsed flags too, before a checkpoint's settings are read)."""
    if settings.predict_only:
        if settings.resume:
            raise UsageError("--predict-only and --resume exclude each other")
        if not settings.checkpoint:
            raise UsageError("--predict-only needs --checkpoint DIR (a finished run directory)")
    elif settings.checkpoint:
        raise UsageError("--checkpoint is for --predict-only (to start from a checkpoint, use --encoder)")


#: The settings --predict-only takes from the run's config.json unless given on the command line.
PREDICT_SETTINGS = ("data_dir", "max_length", "batch_size", "task_file", "task", "tasks",
                    *(f"{t}_{s}" for t in BUILTIN for s in SPLITS))


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="run_multitask.py", description="Multitask fine-tuning behind run_multitask.py "
                                "(the report's sections 4.3 and 5.3): SST-5, QQP, STS and any declared task on one "
                                "encoder.")
    MultitaskConfig.add_arguments(parser)
    cli.add_renamed_flags(parser, RENAMED_FLAGS)
    return parser


def parse(argv=None) -> MultitaskConfig:
    """The run of ``argv``, resolved (see the module's docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_prediction(args)  # before the checkpoint's run settings are read
    if args.predict_only:
        found = runs.run_settings(run_dir_of(resolve_checkpoint(args.checkpoint)))
        if found:
            saved = found[1]
            if isinstance(saved, dict) and "sst_train" in saved:  # a multitask run's settings
                saved = renamed_from_para(saved)
                parser.set_defaults(**{k: saved[k] for k in PREDICT_SETTINGS if k in saved})
    config = MultitaskConfig(**vars(cli.parse_args(parser, argv, upgrade=renamed_from_para)))
    return resolve(config, cli.command_line("run_multitask.py", argv))


def resolve(config: MultitaskConfig, command: str | None = None) -> MultitaskConfig:
    """``config`` resolved as ``parse`` resolves a command line (the device; --encoder defaulting to
    --init, else --model; the default run directory), for a caller that builds the config itself
    (the experiments' fine-tuning runs); ``command``: what config.json records."""
    config = config.on_device()
    encoder = str(config.encoder or config.init or config.model)
    out_dir = config.out_dir
    if out_dir is None and not config.predict_only:
        out_dir = runs.default_out_dir("multitask", runs.model_name(encoder, "encoder"))
    return config.replace(encoder=encoder, out_dir=out_dir, command=command)


def resumed(run_dir, command: str | None = None, /, **changes) -> MultitaskConfig:
    """--resume from Python, as ``run_multitask.py --resume --out-dir RUN_DIR`` resolves it: the run's
    settings from its config.json, ``changes`` over them."""
    flags = {n for n, f in MultitaskConfig.__dataclass_fields__.items() if f.metadata.get("cli")}
    saved = {k: v for k, v in renamed_from_para(cli.saved_settings(run_dir)).items() if k in flags}
    return resolve(MultitaskConfig(**saved | changes | {"out_dir": str(run_dir), "resume": True}), command)
