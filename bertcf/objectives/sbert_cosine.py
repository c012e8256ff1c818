"""SBERT's regression objective: the cosine of the pair's two vectors against a gold similarity."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import UsageError
from ..data.examples import Examples
from .settings import MatryoshkaSettings
from .supervised import Supervised, read_labelled, sts_train_default

#: What a pair file's labels are divided by to give the target in [0, 1].
SCALE = {"sts": 5.0, "qqp": 1.0}


class SBERTCosine(Supervised):
    """The regression objective of Sentence-BERT (Reimers & Gurevych 2019, "Sentence-BERT: Sentence
    Embeddings using Siamese BERT-Networks", EMNLP, section 3), as SBERT trains on STS-B, alone or
    after SBERT-NLI (section 4.2).

    Inputs: pairs (s1, s2) with a gold similarity y [b] scaled to [0, 1] (STS: score / 5; QQP:
    duplicate 1, not 0). With u = f(s1), v = f(s2) [b, D] from the one encoder:

        loss = mean_b (cos(u, v) - y)^2.

    --train-file defaults to the CS224N STS training file of --data-dir. That split holds pairs
    of STS-B's test set, so an STS-B test score after it is not a held-out number.
    Settings: ``MatryoshkaSettings``.
    """

    SETTINGS = (MatryoshkaSettings,)

    def __init__(self, encoder, **settings):
        super().__init__(encoder, **settings)
        self.matryoshka_widths(encoder.output_dim)

    @classmethod
    def read_examples(cls, config, corpus) -> Examples:
        pairs = read_labelled(config, ("sts", "qqp"), sts_train_default(config))
        gold = torch.tensor(pairs.labels, dtype=torch.float32) / SCALE[pairs.kind]
        return Examples([pairs.sentence1, pairs.sentence2], gold, (),
                        f"{len(pairs):,} {pairs.kind} pairs from {', '.join(pairs.sources)}")

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        if labels is None:
            raise UsageError("sbert-cosine needs the pairs' gold similarities (labels)")
        u, v = self.column_embeddings(ids, mask, 2, rank, world)
        y = self.local_labels(labels, ids.shape[0] // 2, rank, world).float()
        cosine = F.cosine_similarity(u.float(), v.float())
        loss = self.at_widths(lambda w, gold: F.mse_loss(F.cosine_similarity(w[0].float(), w[1].float()), gold),
                              [u, v], y)
        with torch.no_grad():
            scalars = {"pair_cosine": cosine.mean(), "gold": y.mean()}
        return loss, scalars
