"""One planned run of a command: its command line, settings, directory and state on disk, and the
marker file (``experiment.json``) that records what it was run with."""
from __future__ import annotations

import json
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
    argv: list
    settings: dict
    description: str
    seed: int = 0                   # its --seed
    spec: Pretraining | None = None
    row: Row | None = None
    depends: PlannedRun | None = None  # the pretraining this one starts from
    state: str = "new"              # new | done | resume | restart
    marker: dict = field(default_factory=dict)


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


def run_planned(kind: str, argv: list[str]) -> dict:
    """A planned run, as its command runs it: ``run_pretrain.py`` (a pretraining) or
    ``run_multitask.py`` (a fine-tuning) with ``argv``, resolved and run in this process."""
    if kind == "pretraining":
        from ..config.pretrain import parse
        from ..training.pretraining import run
    else:
        from ..config.multitask import parse
        from ..training.multitask import run
    return run(parse(argv))
