"""The settings of the training data a model makes: GenQ's queries (``GenQSettings``, for
``data.genq.Generation``) and mined hard negatives (``MiningSettings``, for
``data.negatives.Mining``); ``python -m bertcf.data genq`` and ``mine-negatives`` take them, and
``python -m bertcf.gpl``'s steps 1 and 2 (``bertcf.gpl.config``, under GPL's defaults). The field names are
GPL's (its gpl.json records them); the data commands' flag for a batch is --batch-size. This module
imports no torch: ``python -m bertcf.data download`` builds these flags on a fresh machine."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import cli
from ..data.genq import DEFAULT_GENERATOR, Generation
from ..data.negatives import Mining
from ..settings import Settings, option


@dataclass(frozen=True)
class GenQSettings(Settings):
    """How GenQ draws queries: BEIR's query generator's defaults (``data.genq``)."""

    generator: str = option(DEFAULT_GENERATOR, "the seq2seq query generator: a Hugging Face name or directory "
                                               "(transformers' AutoModelForSeq2SeqLM)")
    queries_per_passage: int = option(Generation.queries_per_passage, "queries sampled per passage (repeats kept "
                                                                      "once)", type=cli.AT_LEAST_1)
    top_p: float = option(Generation.top_p, "nucleus sampling's probability mass", type=cli.TOP_P)
    top_k: int = option(Generation.top_k, "sample among the k likeliest tokens", type=cli.AT_LEAST_1)
    query_max_length: int = option(Generation.max_length, "tokens per generated query, at most", type=cli.AT_LEAST_2)
    generation_batch_size: int = option(Generation.batch_size, "passages given to the generator at once",
                                        type=cli.AT_LEAST_1, flag="--batch-size", metavar="BATCH_SIZE")
    seed: int = option(Generation.seed, "the draws' seed", type=int)

    def generation(self) -> Generation:
        return Generation(self.queries_per_passage, self.top_p, self.top_k, self.query_max_length,
                          self.generation_batch_size, self.seed)


@dataclass(frozen=True)
class MiningSettings(Settings):
    """Which candidates become negatives: sentence-transformers' ``mine_hard_negatives``' controls
    and defaults (``data.negatives.Mining``), and the encoder's batch."""

    num_negatives: int = option(Mining.num_negatives, "negatives per (query, positive) pair", type=cli.AT_LEAST_1)
    range_min: int = option(Mining.range_min, "skip this many nearest candidates (likely unlabelled positives)",
                            type=cli.AT_LEAST_0)
    range_max: int | None = option(Mining.range_max, "consider candidates up to this rank (default: range-min + "
                                                     "negatives + the most positives a query has, ten times the "
                                                     "negatives with a margin or --max-score)", type=cli.AT_LEAST_1)
    max_score: float | None = option(Mining.max_score, "skip candidates scoring above this cosine", type=float)
    min_score: float | None = option(Mining.min_score, "skip candidates scoring below this cosine", type=float)
    absolute_margin: float | None = option(Mining.absolute_margin, "keep a candidate only if it scores at least this "
                                                                   "much below the query's positive", type=float)
    relative_margin: float | None = option(Mining.relative_margin, "keep a candidate only if it scores this share of "
                                                                   "the positive's magnitude below it", type=float)
    sampling: str = option(Mining.sampling, "the best remaining candidates, or a seeded random draw among them",
                           choices=("top", "random"))
    seed: int = option(Mining.seed, "the random draw's seed", type=int)
    chunk_size: int = option(Mining.chunk_size, "queries and corpus entries scored at once: memory stays "
                                                "O(chunk^2)", type=cli.AT_LEAST_1)
    encode_batch_size: int = option(64, "sentences encoded at once", type=cli.AT_LEAST_1, flag="--batch-size",
                                    metavar="BATCH_SIZE")

    def mining(self) -> Mining:
        return Mining(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Mining)})
