"""SBERT's regression objective: the cosine of the pair's two vectors against a gold similarity."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .supervised import ScoredPairs


class SBERTCosine(ScoredPairs):
    """The regression objective of Sentence-BERT (Reimers & Gurevych 2019, "Sentence-BERT: Sentence
    Embeddings using Siamese BERT-Networks", EMNLP, section 3), as SBERT trains on STS-B, alone or
    after SBERT-NLI (section 4.2).

    Inputs: pairs (s1, s2) with a gold similarity y [b] in [0, 1] (``ScoredPairs``: the CS224N STS
    training file by default). With u = f(s1), v = f(s2) [b, D] from the one encoder:

        loss = mean_b (cos(u, v) - y)^2.

    Settings: ``MatryoshkaSettings``.
    """

    @staticmethod
    def pair_loss(u: torch.Tensor, v: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        """The loss of vectors u, v [b, d] (one width) against the gold similarities [b]."""
        return F.mse_loss(F.cosine_similarity(u.float(), v.float()), gold)

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        u, v, y = self.pair_vectors(ids, mask, rank, world, labels)
        cosine = F.cosine_similarity(u.float(), v.float())
        loss = self.at_widths(lambda w, gold: self.pair_loss(*w, gold), [u, v], y)
        with torch.no_grad():
            scalars = {"pair_cosine": cosine.mean(), "gold": y.mean()}
        return loss, scalars
