"""The evaluation command: SentEval's STS and transfer tasks, word similarity (``--tasks
lexical``) and retrieval on a BEIR-layout set, on a sentence encoder; a table on stdout and the
scores as JSON (the tasks and how they are scored: ``bertcf.evaluation.senteval``,
``bertcf.evaluation.lexical`` and ``bertcf.evaluation.retrieval``).

    python -m bertcf.evaluate --encoder runs/<run> [--pooling P] --senteval-dir data/SentEval [--tasks sts,transfer,lexical]
                              [--mode test|dev|fasttest] [--probe senteval|sklearn] [--threads N] [--lexical-dir DIR]
                              [--lexical-pooling cls|mean] [--json FILE]
    python -m bertcf.evaluate --encoder runs/<run> --tasks retrieval --retrieval-dir DIR [--retrieval-score cos|dot]
                              [--rerank CROSS_ENCODER --rerank-top K]
    python -m bertcf.evaluate --encoder runs/<run> --tasks STSBenchmark,mteb-sts,mteb-retrieval --retrieval-dir DIR

``mteb-sts`` and ``mteb-retrieval`` score the same files with mteb's evaluators
(``bertcf.evaluation.mteb_tasks``; the optional extra ``pip install 'bertcf[mteb]'``); for them
``--encoder`` may also be an ONNX export.
"""
from __future__ import annotations

from ..cli import run_main
from ..config.evaluate import parse
from ..evaluation import run as evaluation


def run(argv=None) -> dict:
    """The results of ``argv``'s evaluation (``bertcf.evaluation.run``)."""
    return evaluation.run(parse(argv))


def main(argv=None) -> int:
    return run_main(run, argv)
