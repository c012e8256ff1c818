"""``python -m bertcf.gpl``'s settings (``GPLConfig``), resolved once by ``parse``: the encoder to
adapt and the directory of every step's output, then each step's own (the queries, the negatives,
the margins, the training). The defaults are GPL's (Wang et al. 2022; its ``gpl.train``): BEIR's T5
query generator, 3 queries a passage, negatives drawn from each retriever's top 50,
``cross-encoder/ms-marco-MiniLM-L-6-v2``'s margins, MarginMSE on the dot product, batch 32, lr 2e-5
with 1,000 warm-up steps then a linear decay, 140,000 steps, 350 tokens. The training step takes
any other ``run_pretrain.py`` flag after ``--``."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from .. import cli
from ..config import pretrain
from ..config.datatools import GenQSettings, MiningSettings
from ..config.pretrain import SELECTION
from ..config.train import TrainConfig
from ..data.genq import Generation
from ..data.negatives import Mining
from ..errors import UsageError
from ..objectives.settings import MARGIN_SCORES
from ..settings import Settings, derived, option, redefault

DEFAULT_CROSS_ENCODER = "cross-encoder/ms-marco-MiniLM-L-6-v2"
TRAINING = "step 4: the training (run_pretrain.py --stage supervised --method margin-mse; its other flags after --)"


@dataclass(frozen=True)
class QuerySettings(Settings):
    """Step 1: the queries, generated for --corpus by --generator (GenQ), or given (--queries)."""

    GROUP = "step 1: the queries"
    corpus: str | None = option(None, "the target domain's passages: a set in BEIR's layout (its corpus.jsonl), a BEIR "
                                      "corpus .jsonl, or a text file of one passage a line (default, with --queries "
                                      "DIR: that set's corpus)")
    queries: str | None = option(None, "queries to take instead of generating them: a set in BEIR's layout (its "
                                       "queries and qrels/train.tsv, each query's relevant passages its positives; "
                                       "python -m bertcf.data beir-quora --split train writes one) or a file of "
                                       "query<TAB>positive lines under that header")
    generator: str = redefault(GenQSettings, "generator")
    queries_per_passage: int = redefault(GenQSettings, "queries_per_passage")
    top_p: float = redefault(GenQSettings, "top_p")
    top_k: int = redefault(GenQSettings, "top_k")
    query_max_length: int = redefault(GenQSettings, "query_max_length")
    generation_batch_size: int = redefault(GenQSettings, "generation_batch_size", flag=None,
                                           metavar=None)  # --batch-size: step 4's


@dataclass(frozen=True)
class NegativeSettings(Settings):
    """Step 2: negatives mined by each retriever (``data.negatives.mine``)."""

    GROUP = "step 2: the negatives"
    retriever: list[str] | None = option(None, "the encoders that mine the negatives, each on its own (default: "
                                               "--encoder, the encoder being adapted)", nargs="+", metavar="NAME")
    num_negatives: int = redefault(MiningSettings, "num_negatives",
                                   help="negatives per (query, positive) pair and retriever")
    range_max: int = redefault(MiningSettings, "range_max", 50,
                               help="consider each query's candidates up to this rank (GPL: each retriever's top 50)")
    sampling: str = redefault(MiningSettings, "sampling", "random", help="the negatives among them: a seeded random "
                                                                         "draw (GPL draws at random), or the top ones")
    encode_batch_size: int = redefault(MiningSettings, "encode_batch_size", flag=None, metavar=None,
                                       help="sentences a retriever encodes at once")


@dataclass(frozen=True)
class MarginSettings(Settings):
    """Step 3: the cross-encoder's margins CE(q, pos) - CE(q, neg)."""

    GROUP = "step 3: the margins"
    cross_encoder: str = option(DEFAULT_CROSS_ENCODER, "the cross-encoder whose margins are learnt: a Hugging Face "
                                                       "name or directory that sentence-transformers' CrossEncoder "
                                                       "loads (e.g. python -m bertcf.cross's output)")
    ce_max_length: int | None = option(None, "tokens of a (query, passage) pair the cross-encoder reads (default: "
                                             "its own limit)", type=cli.AT_LEAST_1)
    ce_batch_size: int = option(32, "pairs the cross-encoder scores at once", type=cli.AT_LEAST_1)


@dataclass(frozen=True)
class GPLConfig(MarginSettings, NegativeSettings, QuerySettings):
    """Every setting of a ``python -m bertcf.gpl`` run."""

    encoder: str = option(None, "the bi-encoder to adapt: a Hugging Face BERT name or directory, a checkpoint or a run "
                                "directory", required=True)
    out: str = option(None, "the directory of every step's output (queries/, negatives-N.tsv, margins.tsv, model/); a "
                            "step whose output is there is skipped, and the training continues (--resume)",
                      required=True)
    steps: int = redefault(TrainConfig, "steps", 140_000, group=TRAINING)
    batch_size: int = redefault(TrainConfig, "batch_size", 32, group=TRAINING)
    lr: float = redefault(TrainConfig, "lr", 2e-5, group=TRAINING)
    warmup_steps: int = redefault(TrainConfig, "warmup_steps", 1000, group=TRAINING)
    lr_schedule: str = redefault(TrainConfig, "lr_schedule", "linear", group=TRAINING)
    max_length: int = redefault(TrainConfig, "max_length", 350, group=TRAINING)
    eval_every: int = redefault(TrainConfig, "eval_every", 10_000, group=TRAINING)
    margin_score: str = option("dot", "the bi-encoder's score whose margins are fitted: dot (GPL's) or cos",
                               choices=MARGIN_SCORES, group=TRAINING)
    select_on: str = option("last", "what picks the run's best/: last, the end of the run (GPL keeps the last "
                                    "checkpoint), or as run_pretrain.py's --select-on", choices=tuple(SELECTION),
                            group=TRAINING)
    data_dir: str = option("data", "directory with the CS224N files (the run's STS-dev evaluation reads sts-dev.csv)",
                           group=TRAINING)
    seed: int = redefault(TrainConfig, "seed", group=None)
    device: str | None = redefault(TrainConfig, "device", group=None)
    precision: str | None = redefault(TrainConfig, "precision", group=None)
    progress: str = redefault(TrainConfig, "progress", group=None)
    train_args: list = derived(default_factory=list, help="run_pretrain.py's flags after --, for the training step")
    train_settings: dict = derived(default_factory=dict, help="the settings those flags give, parsed once by "
                                                              "run_pretrain.py's parser (name -> value)")
    command: str | None = derived(help="the command line, which the training step's config.json records")

    def generation(self) -> Generation:
        return GenQSettings(**GenQSettings.pick(self)).generation()

    def mining(self) -> Mining:
        return MiningSettings(**MiningSettings.pick(self)).mining()


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m bertcf.gpl", usage="python -m bertcf.gpl --encoder MODEL --out OUT [flags] [-- run_pretrain.py "
                                           "flags]",
        description="GPL (Wang et al. 2022): domain adaptation of a bi-encoder by generated queries, negatives mined "
                    "by retrievers, a cross-encoder's margins and MarginMSE. Each step's output is kept in OUT and a "
                    "step whose output is there is skipped; run the same command again to continue.")
    GPLConfig.add_arguments(parser)
    return parser


def parse(argv=None) -> GPLConfig:
    """The run of ``argv``: GPL's flags, then after ``--`` the training step's run_pretrain.py flags."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    # run_pretrain.py's flags are parsed once, now, by its parser (abbreviations resolved, a bad one
    # refused before step 1, not hours later at step 4); step 4 builds its config from their values.
    train_parser = pretrain.build_parser()
    train_parser.prog = "python -m bertcf.gpl ... --"
    given = cli.given_values(train_parser, train_args)
    config = GPLConfig(**vars(build_parser().parse_args(ours)) | {
        "train_args": train_args, "train_settings": given, "command": shlex.join(["python", "-m", "bertcf.gpl", *argv])})
    reserved = [f"--{name.replace('_', '-')}" for name in ("stage", "method", "train_file", "out_dir", "resume")
                if name in given]
    if reserved:
        raise UsageError(f"after --: {', '.join(reserved)} belong to the GPL command itself (the training step is "
                         f"--stage supervised --method margin-mse on OUT/margins.tsv, in OUT/model)")
    if config.queries is None and config.corpus is None:
        raise UsageError("give --corpus (the passages to generate queries for) or --queries (queries to take)")
    return config
