"""The experiments command's flags, and the settings an output directory keeps (``suite.json``):
flags not given default to the ones ``OUT`` was started with."""
from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..cli import AT_LEAST_0, AT_LEAST_1, POSITIVE, ArgumentParser, add_renamed_flags
from ..errors import UsageError
from .rows import MLM_BASE

SUITE_FILE = "suite.json"   # OUT's settings, the defaults of later invocations
COMMANDS = ("table1", "ablations", "analysis", "objectives", "all", "mlm-base", "lexical", "supervised",
            "distill")
ALL = ("table1", "ablations", "analysis")  # what ``all`` produces: the report's
#: The settings saved in OUT/suite.json (what the results depend on; not --device, --dry-run...).
SUITE_KEYS = ("model", "data_dir", "corpus", "corpus_from_tasks", "max_sentences", "steps_scale",
              "finetune_steps_scale", "eval_every", "max_train_examples", "max_length", "eval_max_length", "seed",
              "seeds", "preset", "pretrain_args", "finetune_args", "max_analysis_pairs", "qualitative_pairs", "config", "mlm_steps",
              "mlm_args", "lexical_dir", "nli", "teacher")
RENAMED_SETTINGS = {"stage_args": "pretrain_args"}  # old name -> new, in suite.json files written before
#: The commands whose rows start from the MLM base (stages/mlm-base, trained from --config): mlm-base
#: always, distill always (its student's rival), supervised when --config is given.
BASE_COMMANDS = ("mlm-base", "distill")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m bertcf.experiments",
                       description="The report's experiments in one command: table 1, the ablations, the "
                                   "analysis, and the other objectives.")
    p.add_argument("command", choices=COMMANDS,
                   help="what to produce (all: table1, ablations and analysis; objectives is run on its own; "
                        "mlm-base: MLM pretraining from --config, then table1 and the ablations from it; "
                        "lexical: Mirror-BERT's word encoder from --model, on word similarity, against --model; "
                        "supervised: SBERT-NLI, supervised SimCSE and SBERT-NLI then STS from --model, or from the "
                        "MLM base with --config; distill: a student from --config taught by --teacher, against the "
                        "MLM base)")
    p.add_argument("--model", default="bert-base-uncased", help="the BERT every encoder starts from (default %(default)s)")
    p.add_argument("--data-dir", default="data", help="CS224N files (default %(default)s)")
    p.add_argument("--out-dir", default="runs/experiments", help="everything goes here (default %(default)s)")
    g = p.add_argument_group("pretraining corpus (passed to every pretraining run)")
    g.add_argument("--corpus", default=None, help="one sentence per line (default: DATA_DIR/wiki1m_for_simcse.txt)")
    g.add_argument("--corpus-from-tasks", action="store_true", help="the unlabeled sentences of the task train files")
    g.add_argument("--max-sentences", type=AT_LEAST_1, default=None, help="use at most this many corpus sentences")
    g = p.add_argument_group("scale")
    g.add_argument("--steps-scale", type=POSITIVE, default=1.0,
                   help="multiplies the report's steps (10^4 a pretraining, 5000 multitask); default %(default)s")
    g.add_argument("--finetune-steps-scale", type=POSITIVE, default=None,
                   help="multiplies the report's 5000 multitask steps (default: --steps-scale)")
    g.add_argument("--eval-every", type=AT_LEAST_1, default=None,
                   help="passed to every run (default: each command's own)")
    g.add_argument("--max-train-examples", type=AT_LEAST_1, default=None, help="passed to every fine-tuning run")
    g.add_argument("--max-length", type=AT_LEAST_1, default=32,
                   help="tokens per sentence in pretraining (default %(default)s)")
    g.add_argument("--eval-max-length", type=AT_LEAST_1, default=None,
                   help="tokens per sentence in every unsupervised evaluation: the best-checkpoint choice, "
                        "the unsupervised column, analysis and qualitative tables (default: the model's "
                        "max_position_embeddings, i.e. whole sentences)")
    g.add_argument("--seed", type=int, default=11711,
                   help="the seed of every run (default %(default)s); with --seeds, the one whose runs keep the "
                        "directories of a one-seed OUT, and the seed of the MLM base and the analysis samples")
    g.add_argument("--seeds", type=seed_list, default=None,
                   help="comma-separated seeds, e.g. 11711,1,2: every row trained once per seed (--seed's runs in "
                        "OUT/stages, OUT/finetune; another seed's in OUT/seeds/SEED/), tables show mean ± sd "
                        "over them, claims.md tests the report's claims over them (default: --seed alone)")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    g.add_argument("--pretrain-args", default="",
                   help="more flags for every run_pretrain.py run, e.g. '--batch-size 32'")
    g.add_argument("--finetune-args", default="", help="more flags for every run_multitask.py run")
    g = p.add_argument_group("what to run")
    g.add_argument("--rows", default=None,
                   help="comma-separated rows to run (names or keys, e.g. MinBERT,BERT-CF; default: all of the command's)")
    g.add_argument("--preset", choices=("report", "published"), default="report",
                   help="objectives: the methods as the report trains them (their BERT-CF variants), or as their "
                        "papers published them (run_pretrain.py --preset: SimCSE, Mirror-BERT, BSL, CT, TSDAE; "
                        "one epoch of the corpus each)")
    g.add_argument("--no-finetune", action="store_true",
                   help="no multitask fine-tuning in table1, all and mlm-base (the supervised columns stay empty)")
    g.add_argument("--finetune-ablations", action="store_true",
                   help="ablations, all, mlm-base: fine-tune the ablation rows too (Mirror-flow, Mirror-whitening, "
                        "...), so that finetuned.md and the claims have their SST-5, QQP and STS columns")
    g.add_argument("--max-analysis-pairs", type=AT_LEAST_0, default=5000,
                   help="analysis: QQP train pairs sampled for alignment/uniformity (0: all; default %(default)s)")
    g.add_argument("--qualitative-pairs", type=AT_LEAST_1, default=10, help="examples in each qualitative table")
    g.add_argument("--dry-run", action="store_true", help="print the plan and its commands, run nothing")
    g = p.add_argument_group("mlm-base: an MLM encoder from random weights, then table1 and the ablations from it")
    g.add_argument("--config", default=None,
                   help="mlm-base: a directory with a BERT config.json and a vocab.txt (or tokenizer files), no weights")
    g.add_argument("--mlm-steps", type=AT_LEAST_1, default=10_000,
                   help="mlm-base: steps of MLM pretraining, not scaled by --steps-scale (default %(default)s)")
    g.add_argument("--mlm-args", default="",
                   help="mlm-base: more flags for the MLM pretraining, e.g. '--batch-size 128'")
    g = p.add_argument_group("word similarity")
    g.add_argument("--lexical-dir", default=None,
                   help="word-similarity files (SimLex-999's layout or word1<TAB>word2<TAB>score; every .txt/.tsv): "
                        "every encoder scored on them with [CLS] and mean pooling, a column in the objectives and "
                        "ablations tables, the claims tested on them; lexical needs it")
    add_supervised_args(p)
    g = p.add_argument_group("SentEval (when its STS files are there)")
    g.add_argument("--senteval-dir", default=None,
                   help="SentEval's data: adds the STS test average to table1/ablations (default DATA_DIR/SentEval)")
    g.add_argument("--transfer", action="store_true", help="also the transfer tasks' average (fasttest) in table1")
    add_renamed_flags(p, {"--stage-args": "--pretrain-args"})
    return p


def add_supervised_args(p: ArgumentParser) -> None:
    """The flags of the supervised and distill commands."""
    g = p.add_argument_group("supervised and distill")
    g.add_argument("--nli", default=None, metavar="FILE[,FILE]",
                   help="supervised: the NLI training files (SNLI/MultiNLI .jsonl or .txt, or a premise<TAB>"
                        "hypothesis<TAB>label TSV), comma-separated")
    g.add_argument("--teacher", default=None, metavar="DIR|NAME",
                   help="distill: the teacher encoder; the student is --config's BERT from random weights, trained "
                        "for --mlm-steps as the MLM base is (which this command trains too, when OUT has none)")


def seed_list(text: str) -> list[int]:
    """'11711,1,2' -> [11711, 1, 2]: distinct integers, in the order given."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, not {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"must be one or more distinct integers, not {text!r}")
    return seeds


@dataclass(frozen=True)
class Options:
    """The command's settings, resolved once by ``parse_args`` (its flags; the ones not given from
    OUT/suite.json) and then only read, by the plan, the runs and the report: one field per flag,
    and what the flags give once parsed."""

    command: str
    model: str            # with mlm-base, distill (and supervised --config): the MLM base's best/
    data_dir: str
    out_dir: str
    corpus: str | None
    corpus_from_tasks: bool
    max_sentences: int | None
    steps_scale: float
    finetune_steps_scale: float | None
    eval_every: int | None
    max_train_examples: int | None
    max_length: int
    eval_max_length: int | None
    seed: int
    seeds: list | None
    device: str | None
    pretrain_args: str
    finetune_args: str
    rows: str | None
    preset: str
    no_finetune: bool
    finetune_ablations: bool
    max_analysis_pairs: int
    qualitative_pairs: int
    dry_run: bool
    config: str | None
    mlm_steps: int
    mlm_args: str
    lexical_dir: str | None
    nli: str | None
    teacher: str | None
    senteval_dir: str | None
    transfer: bool
    saved_settings: dict | None = None  # OUT/suite.json's settings, when OUT has them
    nli_list: list = field(default_factory=list)  # --nli's files
    pretrain_args_list: list = field(default_factory=list)  # --pretrain-args, --finetune-args, --mlm-args as words
    finetune_args_list: list = field(default_factory=list)
    mlm_args_list: list = field(default_factory=list)


def parse_args(argv=None) -> Options:
    """The command's ``Options``: its flags; the settings of SUITE_KEYS not given default to
    OUT/suite.json's."""
    parser = build_parser()
    args = parser.parse_args(argv)
    saved = None
    suite = Path(args.out_dir) / SUITE_FILE
    if suite.is_file():
        try:
            saved = json.loads(suite.read_text())["settings"]
            saved = {RENAMED_SETTINGS.get(k, k): v for k, v in saved.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UsageError(f"{suite} is not a settings file written by this command") from None
        parser.set_defaults(**{k: v for k, v in saved.items() if k in SUITE_KEYS})
        args = parser.parse_args(argv)
    if args.corpus and args.corpus_from_tasks:
        raise UsageError("give either --corpus or --corpus-from-tasks, not both")
    if args.command == "lexical" and not args.lexical_dir:
        raise UsageError("lexical needs --lexical-dir DIR (word-similarity files, e.g. ../shared/data/lexical)")
    if args.command in ("mlm-base", "distill") and not args.config:
        raise UsageError(f"{args.command} needs --config DIR (a BERT config.json and a vocab.txt, no weights)")
    if args.finetune_ablations and args.command not in ("ablations", "all", "mlm-base"):
        raise UsageError(f"--finetune-ablations: {args.command} has no ablation rows (ablations, all and mlm-base have)")
    if args.finetune_ablations and args.no_finetune:
        raise UsageError("give either --finetune-ablations or --no-finetune, not both")
    if args.command == "distill" and not args.teacher:
        raise UsageError("distill needs --teacher DIR|NAME (the encoder the student learns from)")
    words = {}
    for name in ("pretrain_args", "finetune_args", "mlm_args"):
        try:
            words[name + "_list"] = shlex.split(getattr(args, name))
        except ValueError as e:
            raise UsageError(f"--{name.replace('_', '-')}: {e}") from None
    # every row starts from the MLM base (an absolute path: the same before and after it exists)
    model = str((Path(args.out_dir) / "stages" / MLM_BASE.name / "best").resolve()) if starts_from_base(args) \
        else args.model
    return Options(**vars(args) | words | {"model": model, "saved_settings": saved,
                                           "nli_list": [f.strip() for f in (args.nli or "").split(",") if f.strip()]})


def starts_from_base(args) -> bool:
    """Whether every row of the command starts from the MLM base it trains (``BASE_COMMANDS``)."""
    return args.command in BASE_COMMANDS or (args.command == "supervised" and bool(args.config))
