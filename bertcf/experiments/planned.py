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


def entry_module(kind: str):
    """The module behind a planned run's command: bertcf.pretrain or bertcf.multitask."""
    if kind == "pretraining":
        from .. import pretrain
        return pretrain
    from .. import multitask
    return multitask
