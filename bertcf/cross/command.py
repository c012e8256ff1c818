"""``python -m bertcf.cross`` and ``bertcf-cross``: a cross-encoder on minBERT. ``train`` trains one
on labelled pairs (``bertcf.cross.training``); ``evaluate`` scores a cross-encoder, or a bi-encoder,
on CS224N STS dev, QQP dev and SentEval's STS-B test (``bertcf.cross.evaluation``). Settings:
``bertcf.cross.config``.

    python -m bertcf.cross train --model MODEL --train-file data/sts-train.csv [--head regression|classification]
    python -m bertcf.cross evaluate --model runs/<cross run> [--sets sts-dev,qqp-dev,stsb-test] [--json FILE]
"""
from __future__ import annotations

from ..cli import run_main
from . import evaluation, training
from .config import CrossConfig, parse


def run(argv=None) -> dict:
    """train: the run's summary (with metrics.json's metrics); evaluate: the scores."""
    config = parse(argv)
    return training.run(config) if isinstance(config, CrossConfig) else evaluation.run(config)


def main(argv=None) -> int:
    """The command's exit status (bad input: one line on stderr, 2)."""
    return run_main(run, argv)
