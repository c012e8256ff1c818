"""``run_multitask.py`` and ``bertcf-multitask``: multitask fine-tuning (SST-5, QQP, STS). Parses and
resolves the settings (``bertcf.config.multitask``), then runs them (``bertcf.training.multitask``)."""
from __future__ import annotations

from ..cli import run_main
from ..config.multitask import parse
from ..training import multitask


def run(argv=None) -> dict:
    """The run of ``argv``: its summary (with the final dev metrics), or --predict-only's metrics."""
    return multitask.run(parse(argv))


def main(argv=None) -> int:
    """The command's exit status (bad input: one line on stderr, 2)."""
    return run_main(run, argv)
