"""``python -m bertcf.gpl`` and ``bertcf-gpl``: GPL, the domain adaptation of a bi-encoder by generated queries, mined
negatives, a cross-encoder's margins and MarginMSE (``bertcf.gpl.pipeline``), each step's output
kept in --out and skipped when it is there.

    python -m bertcf.gpl --encoder MODEL --out OUT --corpus PASSAGES [--generator NAME] [--retriever NAME ...]
                         [--cross-encoder NAME] [--steps N ...] [-- run_pretrain.py flags]
    python -m bertcf.gpl --encoder MODEL --out OUT --queries SET_OR_PAIRS [--corpus PASSAGES] ...
"""
from __future__ import annotations

from ..cli import run_main
from . import pipeline
from .config import parse


def run(argv=None) -> dict:
    """What each step that ran returned (``pipeline.Pipeline.run``)."""
    return pipeline.run(parse(argv))


def main(argv=None) -> int:
    """The command's exit status (bad input: one line on stderr, 2; a stopped training: 130 or 143)."""
    return run_main(run, argv)
