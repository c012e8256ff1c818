"""``python -m bertcf.evaluate``'s settings (``EvaluateConfig``), resolved once by ``parse``: which
encoder, which tasks on which data, how they are scored, and with what."""
from __future__ import annotations

from dataclasses import dataclass

from .. import cli
from ..evaluation.evaluators import PAIR_FEATURES
from ..evaluation.lexical import POOLINGS as LEXICAL_POOLINGS
from ..evaluation.probe import usable_cores
from ..evaluation.retrieval import SCORES
from ..evaluation.senteval import MODES, PROBES
from ..settings import option, redefault
from .model import ModelConfig
from .search import IndexConfig
from .train import TrainConfig


@dataclass(frozen=True)
class EvaluateConfig(IndexConfig):
    """Every setting of a ``python -m bertcf.evaluate`` run (the search index's: --tasks retrieval)."""

    encoder: str = option(None, "checkpoint, run directory or Hugging Face BERT name/directory; or, for the mteb "
                                "tasks only, an ONNX export (bertcf-export onnx)", required=True)
    vocab: str | None = redefault(ModelConfig, "vocab", group=None)
    pooling: str | None = redefault(ModelConfig, "pooling", group=None)
    senteval_dir: str = option("data/SentEval", "SentEval's data/downstream/ layout (see data/README.md)")
    tasks: str = option("sts", "comma-separated: sts, transfer, SentEval task names, lexical (word similarity, needs "
                               "--lexical-dir), retrieval (needs --retrieval-dir); mteb-sts, mteb-retrieval: mteb's "
                               "evaluators on STS-B of --senteval-dir and on --retrieval-dir (pip install "
                               "'bertcf[mteb]')")
    lexical_dir: str = option("data/lexical", "--tasks lexical: every .txt/.tsv file here is a word-similarity task "
                                              "(SimLex-999's layout, or word1<TAB>word2<TAB>score)")
    lexical_pooling: str | None = option(None, "--tasks lexical: the word vector, [CLS] or the mean of the word's "
                                               "tokens (default: the encoder's pooling)", choices=LEXICAL_POOLINGS)
    mode: str = option("test", "test; dev (STS-B dev + SICK-R trial); fasttest (SentEval's prototyping settings: 5 "
                               "folds; with --probe sklearn a fixed C)", choices=MODES)
    probe: str = option("senteval", "the transfer tasks' classifier: senteval = SentEval's PyTorch probe "
                                    "(usepytorch=True, as the published tables); sklearn = scikit-learn's logistic "
                                    "regression (usepytorch=False)", choices=PROBES)
    threads: int | None = option(None, "torch threads (set explicitly) and the processes that train the transfer "
                                       "tasks' probes (default: the cores this process may use)", type=cli.AT_LEAST_1)
    mrpc_features: str = option("senteval", "the MRPC probe's features of a pair (u, v): senteval = [|u-v|, u*v], as "
                                            "SentEval and the published tables; full = [u, v, |u-v|, u*v]",
                                choices=PAIR_FEATURES)
    retrieval_dir: str | None = option(None, "a set in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/test.tsv) for "
                                             "--tasks retrieval and mteb-retrieval")
    retrieval_score: str | None = option(None, "retrieval's score: cos or dot (default: the model's sentence-"
                                               "transformers similarity_fn_name, else cos; the same for an encoder "
                                               "that normalises its vectors)", choices=SCORES)
    index: str = redefault(IndexConfig, "index", "exact", help="--tasks retrieval: exact, every document scored "
                           "(no faiss needed); hnsw, int8 or binary, the corpus in that search index (see "
                           "python -m bertcf.search)")
    rerank: str | None = option(None, "--tasks retrieval: rescore each query's best --rerank-top documents with this "
                                      "cross-encoder (a checkpoint, run directory or Hugging Face name, e.g. "
                                      "cross-encoder/ms-marco-MiniLM-L-6-v2) and rank them by its scores",
                                metavar="DIR|NAME")
    rerank_top: int = option(100, "--rerank: how many of each query's documents, the encoder's best, are rescored",
                             type=cli.AT_LEAST_1)
    batch_size: int = option(64, "sentences (or --rerank's pairs) encoded at once", type=cli.AT_LEAST_1)
    max_length: int | None = option(None, "tokens per sentence (default: whole sentences, up to the model's maximum)",
                                    type=cli.AT_LEAST_1)
    truncate_dim: int | None = option(None, "score each task on the vectors' first k dimensions (a Matryoshka-trained "
                                            "model's smaller widths; sentence-transformers' truncate_dim)",
                                      type=cli.AT_LEAST_1)
    device: str | None = redefault(TrainConfig, "device", group=None)
    precision: str | None = redefault(TrainConfig, "precision", group=None)
    json: str | None = option(None, "write the results to this JSON file (with \"environment\": versions, device, "
                                    "CPU, command)")
    no_progress: bool = option(False, "no progress (by default a bar on a terminal, plain lines with the time left in a "
                                      "log file)",
                               switch=True)


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m bertcf.evaluate",
                                description="SentEval's STS and transfer tasks, word similarity, and retrieval on a "
                                            "set in BEIR's layout, on a sentence encoder; mteb's evaluators on the "
                                            "same files.")
    EvaluateConfig.add_arguments(parser)
    return parser


def parse(argv=None) -> EvaluateConfig:
    """The evaluation of ``argv``: --threads resolved to the cores this process may use."""
    config = EvaluateConfig(**vars(build_parser().parse_args(argv)))
    return config.replace(threads=config.threads or usable_cores())
