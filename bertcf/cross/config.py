"""``python -m bertcf.cross``'s settings: ``train`` (``CrossConfig``: a cross-encoder trained on
labelled pairs) and ``evaluate`` (``CrossEvalConfig``: a cross-encoder, or a bi-encoder, scored on
the pair sets), resolved once by ``parse``."""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

from .. import cli, runs
from ..config.data import DataConfig
from ..config.model import ModelConfig
from ..config.train import TrainConfig
from ..errors import UsageError
from ..settings import Settings, derived, option, redefault
from .evaluation import PAIR_SETS

PROG = "python -m bertcf.cross"
HEADS = ("regression", "classification")
SELECT_ON = ("sts-dev", "qqp-dev", "last")


@dataclass(frozen=True)
class PairSetsConfig(Settings):
    """Where the pair sets are: the CS224N dev files and SentEval's STS-B test."""

    GROUP = "pair sets"
    sts_dev: str | None = option(None, "the CS224N STS dev file (default DATA_DIR/sts-dev.csv)", metavar="FILE")
    qqp_dev: str | None = option(None, "the CS224N QQP dev file (default DATA_DIR/quora-dev.csv)", metavar="FILE")
    senteval_dir: str | None = option(None, "SentEval's data, for STS-B test (STS/STSBenchmark/sts-test.csv; default "
                                            "DATA_DIR/SentEval)", metavar="DIR")
    sets: str | None = option(None, f"comma-separated of {', '.join(PAIR_SETS)} (default: those whose files exist)")

    def set_names(self, none_allowed: bool = False) -> tuple[str, ...] | None:
        """The sets asked for (None: those whose files exist; ``none_allowed``: "none" is no set); a
        UsageError for an unknown name."""
        if self.sets is None:
            return None
        if none_allowed and self.sets.strip() == "none":
            return ()
        names = tuple(s.strip() for s in self.sets.split(",") if s.strip())
        unknown = [s for s in names if s not in PAIR_SETS]
        if unknown or not names:
            raise UsageError(f"--sets takes {', '.join(PAIR_SETS)}{' or none' if none_allowed else ''}, "
                             f"not {self.sets!r}")
        return names


@dataclass(frozen=True)
class CrossHeadConfig(Settings):
    """What the cross-encoder learns and from what."""

    GROUP = "cross-encoder"
    head: str = option("regression", "regression: one logit, binary cross-entropy with logits against the label "
                                     "scaled to [0, 1] (STS score / 5, QQP's 0 or 1), as sentence-transformers trains "
                                     "its STS and Quora cross-encoders; classification: one logit per class, "
                                     "cross-entropy (QQP's 2 classes, NLI's 3)", choices=HEADS)
    train_file: list[str] | None = option(None, "labelled pairs of one kind: CS224N STS or QQP files, or NLI files "
                                                "(--head classification) (default DATA_DIR/sts-train.csv)",
                                          nargs="+", metavar="FILE")
    select_on: str | None = option(None, "what picks best/: sts-dev (CS224N STS dev Spearman), qqp-dev (QQP dev "
                                         "accuracy) or last (the last evaluation); default qqp-dev for QQP training "
                                         "files, last for NLI, else sts-dev", choices=SELECT_ON)
    max_train_examples: int | None = option(None, "use the first N training pairs", type=cli.AT_LEAST_1)
    max_eval_examples: int | None = option(None, "score the first N pairs of the selection set during training "
                                                 "(default all; metrics.json at the end always scores all)",
                                           type=cli.AT_LEAST_1)


@dataclass(frozen=True)
class CrossConfig(PairSetsConfig, CrossHeadConfig, TrainConfig, DataConfig, ModelConfig):
    """Every setting of ``python -m bertcf.cross train``."""

    model: str = redefault(ModelConfig, "model", help="the BERT to start from (a Hugging Face BERT name or directory), "
                                                       "or a cross-encoder to train further (a checkpoint, run "
                                                       "directory or hub name of a BertForSequenceClassification)")
    init: str | None = redefault(ModelConfig, "init", cli=False)
    pooling: str | None = redefault(ModelConfig, "pooling", cli=False)  # the pooler's [CLS], always
    steps: int = redefault(TrainConfig, "steps", 1500)
    lr: float = redefault(TrainConfig, "lr", 2e-5)
    warmup_steps: int = redefault(TrainConfig, "warmup_steps", 150)
    lr_schedule: str = redefault(TrainConfig, "lr_schedule", "linear")
    max_length: int = redefault(TrainConfig, "max_length", 128, help="tokens per pair, both texts together (the "
                                                                      "longer one cut first)")
    batch_sampler: str | None = redefault(TrainConfig, "batch_sampler", cli=False)
    sets: str | None = redefault(PairSetsConfig, "sets", help=f"the pair sets best/ is scored on at the end, into "
                                 f"metrics.json: comma-separated of {', '.join(PAIR_SETS)}, or none (default: those "
                                 f"whose files exist; each scored with its progress and the time left)")
    out_dir: str | None = redefault(TrainConfig, "out_dir", help="run directory (default runs/cross-<model>-<time>)")
    command: str | None = derived(help="the command line that started the run")


@dataclass(frozen=True)
class CrossEvalConfig(PairSetsConfig, DataConfig):
    """Every setting of ``python -m bertcf.cross evaluate``."""

    model: str = option(None, "a cross-encoder (checkpoint, run directory or hub name), or a sentence encoder (scored "
                              "by the cosine of its two vectors)", required=True, metavar="DIR|NAME", group="model")
    vocab: str | None = redefault(ModelConfig, "vocab")
    batch_size: int = option(64, "pairs (or sentences) scored at once", type=cli.AT_LEAST_1, group="model")
    device: str | None = redefault(TrainConfig, "device", group="model")
    precision: str | None = redefault(TrainConfig, "precision", group="model")
    progress: str = redefault(TrainConfig, "progress", help="each set's pairs scored and the time left: a bar (on a "
                              "terminal, with auto), plain lines (in a log file, with auto), or none", group="model")
    json: str | None = option(None, "write the results to this JSON file", metavar="FILE", group="model")


SUBCOMMANDS = {"train": (CrossConfig, "train a cross-encoder on labelled pairs (a run directory: best/, last/, "
                                      "--resume, metrics.json)"),
               "evaluate": (CrossEvalConfig, "score a cross-encoder (or a bi-encoder) on CS224N STS dev, QQP dev "
                                             "and SentEval's STS-B test")}


def build_parser(subcommand: str | None = None) -> cli.ArgumentParser:
    """The parser of one subcommand, or (None) the command's, which names them."""
    if subcommand is not None:
        settings, help = SUBCOMMANDS[subcommand]
        parser = cli.ArgumentParser(prog=f"{PROG} {subcommand}", description=help[0].upper() + help[1:] + ".")
        settings.add_arguments(parser)
        return parser
    parser = cli.ArgumentParser(prog=PROG, description="A cross-encoder on minBERT: both texts of a pair read "
                                "together ([CLS] a [SEP] b [SEP]), scored from the pooled [CLS] vector.")
    commands = parser.add_subparsers(dest="subcommand", required=True, metavar="{train,evaluate}")
    for name, (_, help) in SUBCOMMANDS.items():
        commands.add_parser(name, help=help, add_help=False)
    return parser


def parse(argv=None) -> CrossConfig | CrossEvalConfig:
    """The subcommand of ``argv``, resolved: train's device, precision, run directory and command
    line (with --resume, the run's saved settings first)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        build_parser().parse_args(argv[:1])  # --help, or argparse's one line naming the subcommands
        raise UsageError(f"{PROG}: the first word is train or evaluate")  # not reached: argparse exits
    subcommand, rest = argv[0], argv[1:]
    parser = build_parser(subcommand)
    if subcommand == "evaluate":
        return CrossEvalConfig(**vars(parser.parse_args(rest)))
    config = CrossConfig(**vars(cli.parse_args(parser, rest))).on_device()
    name = runs.model_name(config.model, "model")  # a run directory without best/ is refused here
    out_dir = config.out_dir or runs.default_out_dir("cross", name)
    return config.replace(out_dir=out_dir, command=shlex.join(["python", "-m", "bertcf.cross", *argv]))
