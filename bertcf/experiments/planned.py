"""One planned run of a command: its command line, settings, directory and state on disk, and the
marker file (``experiment.json``) that records what it was run with."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .rows import Pretraining, Row

MARKER = "experiment.json"  # in every pretraining / fine-tuning directory this command runs


@dataclass
class PlannedRun:
    """One run of ``run_pretrain.py`` (a pretraining) or ``run_multitask.py`` (a fine-tuning)."""
    kind: str                       # "pretraining" or "finetune"
    label: str                      # the row it is for, as printed
    dir: Path
    argv: list                      # its command line, as printed and recorded (a pretraining's: values, then words)
    settings: dict
    description: str
    seed: int = 0                   # its --seed
    spec: Pretraining | None = None
    row: Row | None = None
    depends: PlannedRun | None = None  # the pretraining this one starts from
    state: str = "new"              # new | done | resume | restart
    marker: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)  # the settings the plan gives, typed (PretrainConfig's, MultitaskConfig's)
    words: list = field(default_factory=list)   # flags given as words: a row's, --pretrain-args, --finetune-args


def abs_if_path(value):
    """Local paths are compared resolved (a hub name is kept as it is)."""
    if value is None:
        return None
    return str(Path(value).resolve()) if Path(value).exists() else str(value)


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def now() -> str:
    return datetime.now().isoformat(timespec="seconds")


def run_planned(task: PlannedRun) -> dict:
    """A planned run, as its command runs it, in this process (continued when ``task.state`` is
    resume): a pretraining or a fine-tuning from the config the plan builds (``pretraining_config``,
    ``finetune_config``)."""
    resume = task.state == "resume"
    if task.kind == "pretraining":
        from ..training.pretraining import run
        return run(pretraining_config(task, resume))
    from ..multitask.command import run_config
    return run_config(finetune_config(task, resume))


def finetune_config(task: PlannedRun, resume: bool = False):
    """A fine-tuning's ``MultitaskConfig``, built as :func:`pretraining_config` builds a
    pretraining's: the plan's typed settings, then --finetune-args' words parsed once by
    run_multitask.py's parser (and winning)."""
    from ..cli import given_values
    from ..multitask import config as multitask

    values = task.values | given_values(multitask.build_parser(), task.words)
    command = shlex.join(["python", "run_multitask.py", *task.argv, *(["--resume"] if resume else [])])
    if resume:
        return multitask.resumed(task.dir, command, **values)
    return multitask.resolve(multitask.MultitaskConfig(**values), command)


def pretraining_config(task: PlannedRun, resume: bool = False):
    """A pretraining's ``PretrainConfig``, built from the plan's typed settings (``task.values``) and
    its flags given as words (a row's, --pretrain-args: parsed once, by run_pretrain.py's parser,
    and winning over the plan's), resolved as run_pretrain.py resolves its command line (with
    ``resume``, as ``--resume`` does); config.json records that command line."""
    from ..cli import given_values
    from ..config import pretrain

    values = task.values | given_values(pretrain.build_parser(), task.words)
    command = shlex.join(["python", "run_pretrain.py", *task.argv, *(["--resume"] if resume else [])])
    if resume:
        return pretrain.resumed(task.dir, command, **values)
    return pretrain.resolve(pretrain.PretrainConfig(**values), set(values), command)
