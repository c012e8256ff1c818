"""Word similarity: how well the cosines of an encoder's word vectors rank word pairs as people do
(SimLex-999, Hill et al. 2015; Multi-SimLex, Vulić et al. 2020), the lexical half of Mirror-BERT's
evaluation (Liu et al. 2021, Table 1).

Each word is encoded alone, as a one-word "sentence" ([CLS] word-pieces [SEP]), as Mirror-BERT's
evaluation script does; the vector is the encoder's pooling unless a pooling is asked for: [CLS]'s
last hidden state, or the mean over the word's tokens, [CLS] and [SEP] included (the script's
``mean_std``; its ``mean`` also averages the padding up to 64 tokens). The score is Spearman's rho
×100 of cos(u, v) against the gold similarities, with a 95% percentile bootstrap interval over the
pairs, as for STS.
"""
from __future__ import annotations

import contextlib
import zlib

import torch
import torch.nn.functional as F

from ..data.words import read_word_pairs, word_similarity_files
from ..errors import UsageError
from ..models.encoder import FIRST_LAST_AVG
from ..models.encoder import POOLINGS as ENCODER_POOLINGS
from . import bootstrap
from .metrics import spearman

#: A word's vector: the encoder's poolings but first-last-avg, which averages whole layers (a
#: sentence's), not the word's own tokens.
POOLINGS = tuple(p for p in ENCODER_POOLINGS if p != FIRST_LAST_AVG)


class WordSimilarityEvaluator:
    """Spearman ×100 between cos(u, v) of the two words' vectors and the gold scores.

    ``pairs``: a list of ``data.words.WordPair``; ``pooling``: the representation it needs (None:
    the encoder's own; the caller encodes its ``sentences()`` that way). ``__call__(embed)`` returns
    {"spearman", "n", "ci95" (the 95% percentile bootstrap interval over ``resamples`` resamples of
    the pairs; the seed is a hash of the task's name), "replicates" [resamples] and "pairs"
    ({"scores": cosines, "gold"}) for the caller to take out}."""

    main_metric = "spearman"

    def __init__(self, name: str, pairs: list, pooling: str | None = None, resamples: int = 1000):
        if pooling not in (None, *ENCODER_POOLINGS):
            raise ValueError(f"pooling must be one of {ENCODER_POOLINGS} or None, not {pooling!r}")
        self.name, self.pairs, self.pooling, self.resamples = name, pairs, pooling, resamples
        self.seed = zlib.crc32(name.encode())

    def sentences(self) -> list[str]:
        return [w for p in self.pairs for w in (p.word1, p.word2)]

    def __call__(self, embed) -> dict:
        # float64, as for STS: float32 rounding can make or break ties among the cosines
        u = embed([p.word1 for p in self.pairs]).double()
        v = embed([p.word2 for p in self.pairs]).double()
        cosines = F.cosine_similarity(u, v, dim=-1)
        gold = [p.score for p in self.pairs]
        replicates = 100 * bootstrap.replicates(cosines, gold, "spearman", self.resamples, self.seed)
        return {"spearman": 100 * spearman(cosines, gold), "n": len(self.pairs),
                "ci95": bootstrap.percentile_interval(replicates), "replicates": replicates,
                "pairs": {"scores": cosines.tolist(), "gold": gold}}


def word_similarity_evaluators(lexical_dir, pooling: str | None = None) -> list[WordSimilarityEvaluator]:
    """One evaluator per word-similarity file of ``lexical_dir`` (``data.words``), its pairs read
    (a malformed row is a DataError naming the file and line)."""
    return [WordSimilarityEvaluator(name, read_word_pairs(path), pooling)
            for name, path in word_similarity_files(lexical_dir).items()]


def check_pooling(encoder, pooling: str | None) -> str:
    """The pooling the word vectors get: ``pooling``, or the encoder's. A flow or a linear head (a
    whitening) was fitted to the encoder's own pooling, so another one is refused there."""
    if pooling not in (None, *POOLINGS):
        raise UsageError(f"--lexical-pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
    chosen = pooling or encoder.pooling
    fitted = [name for name in ("flow", "dense") if getattr(encoder, name, None) is not None]
    if fitted and chosen != encoder.pooling:
        what = "flow" if fitted[0] == "flow" else "linear head"
        raise UsageError(f"--lexical-pooling {chosen}: this encoder's {what} was fitted to its {encoder.pooling} "
                         f"pooling; score it with that pooling")
    return chosen


@contextlib.contextmanager
def pooling_as(encoder, pooling: str):
    """The encoder pools by ``pooling`` inside the block, by its own again after it."""
    own = encoder.pooling
    encoder.pooling = pooling
    try:
        yield encoder
    finally:
        encoder.pooling = own


def encode_with(encoder, sentences: list[str], pooling: str, **kwargs) -> torch.Tensor:
    """``encoder.encode(sentences, **kwargs)`` with the vectors pooled by ``pooling``."""
    with pooling_as(encoder, pooling):
        return encoder.encode(sentences, **kwargs)


def take_results(evaluators, scores: dict, pair_scores: bool = False) -> dict:
    """The evaluation's lexical part from ``scores`` ({task: evaluator result}): {"lexical": {task:
    Spearman ×100}, "lexical_detail": {task: spearman, n, ci95, pooling}} and, with ``pair_scores``,
    "lexical_pairs": {task: {"scores", "gold"}} (for bootstraps over several encoders)."""
    result = {"lexical": {}, "lexical_detail": {}} | ({"lexical_pairs": {}} if pair_scores else {})
    for evaluator in evaluators:
        r = dict(scores[evaluator.name])
        r.pop("replicates")
        pairs = r.pop("pairs")
        if pair_scores:
            result["lexical_pairs"][evaluator.name] = pairs
        result["lexical"][evaluator.name] = r[evaluator.main_metric]
        result["lexical_detail"][evaluator.name] = r | {"pooling": evaluator.pooling}
    return result


def evaluate_words(encoder, lexical_dir, pooling: str | None = None, batch_size: int = 64,
                   pair_scores: bool = False, show_progress_bar: bool = False) -> dict:
    """Every word-similarity task of ``lexical_dir`` on ``encoder``, each distinct word encoded once
    (pooled by ``pooling``, default the encoder's): the dict of :func:`take_results`."""
    chosen = check_pooling(encoder, pooling)
    evaluators = word_similarity_evaluators(lexical_dir, chosen)
    words = list(dict.fromkeys(w for e in evaluators for w in e.sentences()))
    vectors = encode_with(encoder, words, chosen, batch_size=batch_size, show_progress_bar=show_progress_bar)
    row = {w: i for i, w in enumerate(words)}
    scores = {e.name: e(lambda batch: vectors[[row[w] for w in batch]]) for e in evaluators}
    return take_results(evaluators, scores, pair_scores)
