"""``run_multitask.py`` and ``bertcf-multitask``: multitask fine-tuning. Parses and resolves the
settings (``bertcf.multitask.config``), then runs them (``bertcf.multitask.trainer``)."""
from __future__ import annotations

from ..cli import run_main
from .config import parse
from .trainer import run as run_config


def run(argv=None) -> dict:
    """The run of ``argv``: its summary (with the final dev metrics), or --predict-only's metrics."""
    return run_config(parse(argv))


def main(argv=None) -> int:
    """The command's exit status (bad input: one line on stderr, 2)."""
    return run_main(run, argv)
