"""``run_pretrain.py`` and ``bertcf-pretrain``: the self-supervised and supervised stages. Parses
and resolves the settings (``bertcf.config.pretrain``), then runs them
(``bertcf.training.pretraining``)."""
from __future__ import annotations

from ..cli import run_main
from ..config.pretrain import parse
from ..training import pretraining


def run(argv=None) -> dict:
    """The run of ``argv``: its summary (step, first and best score, best step, interrupted)."""
    return pretraining.run(parse(argv))


def main(argv=None) -> int:
    """The command's exit status (bad input: one line on stderr, 2)."""
    return run_main(run, argv)
