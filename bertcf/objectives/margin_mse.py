"""MarginMSE: a bi-encoder distilled from a cross-encoder's margins (GPL's training objective)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data.examples import Examples
from ..data.negatives import read_margins
from ..data.pairs import pair_kind
from ..errors import UsageError
from .settings import MarginMSESettings
from .supervised import Supervised, train_files


def pair_scores(queries: torch.Tensor, passages: torch.Tensor, score: str = "dot") -> torch.Tensor:
    """[b] scores of row i of ``queries`` with row i of ``passages`` [b, D]: the dot product, or the cosine."""
    queries, passages = queries.float(), passages.float()
    if score == "cos":
        return F.cosine_similarity(queries, passages, dim=-1)
    return (queries * passages).sum(-1)


def margin_mse(queries, positives, negatives, margins, score: str = "dot") -> torch.Tensor:
    """mean over the b rows of (s(q, pos) - s(q, neg) - margin)^2: ``queries``, ``positives``,
    ``negatives`` [b, D], ``margins`` [b]."""
    predicted = pair_scores(queries, positives, score) - pair_scores(queries, negatives, score)
    return F.mse_loss(predicted, margins.float())


class MarginMSE(Supervised):
    """MarginMSE (Hofstätter et al. 2020, "Improving Efficient Neural Ranking Models with
    Cross-Architecture Knowledge Distillation", arXiv:2010.02666): the bi-encoder's margin between a
    query's positive and negative passage regressed on a teacher's, as GPL trains it (Wang et al.
    2022, "GPL: Generative Pseudo Labeling for Unsupervised Domain Adaptation of Dense Retrieval",
    NAACL), where the teacher is a cross-encoder and the margin CE(q, pos) - CE(q, neg).

    Inputs: rows (q, pos, neg) with a margin m [b] (a file of query<TAB>positive<TAB>negative<TAB>
    margin rows under that header, ``data.negatives.write_margins``; ``python -m bertcf.gpl`` writes
    one). With u = f(q), v+ = f(pos), v- = f(neg) [b, D] and s the dot product (``--margin-score
    cos``: the cosine):

        loss = mean over the rows of (s(u, v+) - s(u, v-) - m)^2,

    sentence-transformers' ``MarginMSELoss`` (its default ``pairwise_dot_score``; GPL's
    ``MarginDistillationLoss`` with "dot"). No in-batch negatives: a row's loss is its own, so a
    repeated text in a batch does no harm (the random batch order is the default).

    Settings: ``MarginMSESettings`` (``margin_score``). ``--mini-batch-size``: the three columns go
    through the encoder M rows at a time with the gradient cache."""

    mini_batches = True
    SETTINGS = (MarginMSESettings,)

    @classmethod
    def read_examples(cls, config, corpus) -> Examples:
        files = train_files(config)
        other = [f"{f} ({kind})" for f in files if (kind := pair_kind(f)) != "margins"]
        if other:
            raise UsageError(f"--method margin-mse trains on files of query<TAB>positive<TAB>negative<TAB>margin rows "
                             f"under that header (python -m bertcf.gpl writes one), not {', '.join(other)}")
        rows = [r for f in files for r in read_margins(f)]
        queries, positives, negatives, margins = zip(*rows)
        return Examples([list(queries), list(positives), list(negatives)], torch.tensor(margins, dtype=torch.float32),
                        (), f"{len(rows):,} (query, positive, negative) rows with margins from "
                            f"{', '.join(map(str, files))}")

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        if labels is None:
            raise UsageError("margin-mse needs each row's margin (labels)")
        queries, positives, negatives = self.column_embeddings(ids, mask, 3, rank, world)
        margins = self.local_labels(labels, ids.shape[0] // 3, rank, world).float()
        loss = margin_mse(queries, positives, negatives, margins, self.settings.margin_score)
        with torch.no_grad():
            predicted = (pair_scores(queries, positives, self.settings.margin_score)
                         - pair_scores(queries, negatives, self.settings.margin_score))
            scalars = {"margin": predicted.mean(), "teacher_margin": margins.mean()}
        return loss, scalars
