"""The report's experiments in one command: table 1, the ablations, the analysis, and the other objectives.

    python -m bertcf.experiments table1     --model DIR --data-dir DIR --out-dir runs/experiments
    python -m bertcf.experiments ablations  ...
    python -m bertcf.experiments analysis   ...
    python -m bertcf.experiments all        ...   (the three, each pretraining run once)
    python -m bertcf.experiments objectives ...   (not in all: four more pretraining runs)

Encoders (report table 1): MinBERT (``--model`` untouched), MinBERT-SimCSE (mirror stage,
``--method simcse``), MinBERT-Mirror (mirror stage), MinBERT-flow (flow stage on ``--model``),
BERT-CF (joint stage from the Mirror run). Ablations: SimCSE-joint (joint ``--method simcse``
from the SimCSE run), MinBERT-joint (joint ``--unfreeze-encoder`` from ``--model``), Mirror-flow
(flow stage from the Mirror run). Objectives (not in the report, so not part of ``all``):
MinBERT-BSL, -CT, -TSDAE and -MLM (mirror stage, ``--method bsl|ct|tsdae|mlm``, from
``--model``; see bertcf/objectives/), each one more pretraining run, with MinBERT, MinBERT-SimCSE
and MinBERT-Mirror as reference rows (the latter two once table1 or all has trained them in ``OUT``).

Every pretraining (stage 1 or 2 of the report) is a run of ``run_pretrain.py`` in
``OUT/stages/<name>/``, every fine-tuning (stage 3) a run of ``run_multitask.py`` in
``OUT/finetune/<row>/``, each resolved and run in this process as its command would. A pretraining shared by
several rows is trained once; a finished one
(``experiment.json`` with status ``done``) is reused, an interrupted one is continued with
``--resume``, so rerunning the same command carries on where it stopped. Settings not given
on the command line default to the ones ``OUT`` was started with (``OUT/suite.json``).

``--seeds S1,S2,...`` trains every row once per seed: --seed's runs where a one-seed command puts
them, every other seed's in ``OUT/seeds/<seed>/``; each table cell is then the mean ± sd over the
seeds, and ``claims.md/json`` test the report's comparative claims by a paired, hierarchical
bootstrap over the seeds and the evaluation pairs.

Outputs (each written atomically): ``table1.md/json``, ``ablations.md/json``,
``analysis.md/json``, ``claims.md/json``, ``qualitative.md``, ``figures/*.png`` and ``tb/``
(TensorBoard: the cosine histograms and the tables as text); ``objectives.md/json``.

The package, bottom up: ``options`` (flags, suite.json), ``rows`` (what is trained), ``planned``
(one planned run and its marker), ``checks`` (a run's state on disk and what stands in its way),
``plan`` (every run of a command), ``execute`` (running them), ``results`` (evaluating each row
for each seed, cached), ``published`` (the report's numbers), ``tables`` (cells and markdown),
``claims`` (the report's claims, tested), ``analysis`` and ``report`` (rendering the outputs) and
``suite`` (all of it in order). The command line is ``bertcf.commands.experiments``.
"""
from .options import build_parser, parse_args
from .plan import Plan
from .planned import MARKER
from .published import REPORT_ABLATIONS, REPORT_ANALYSIS, REPORT_TABLE1
from .results import FINETUNE_METRICS, finetune_metrics, pair_analysis, read_predictions
from .rows import PRETRAININGS, Row

__all__ = ["build_parser", "parse_args", "MARKER", "PRETRAININGS", "Plan", "Row", "REPORT_ABLATIONS",
           "REPORT_ANALYSIS", "REPORT_TABLE1", "FINETUNE_METRICS", "finetune_metrics", "pair_analysis",
           "read_predictions"]
