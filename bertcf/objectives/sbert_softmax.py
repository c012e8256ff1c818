"""SBERT's classification objective: a softmax classifier over the pair's two vectors."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UsageError
from ..data.examples import Examples
from .supervised import Supervised, read_labelled


class SBERTSoftmax(Supervised):
    """The classification objective of Sentence-BERT (Reimers & Gurevych 2019, "Sentence-BERT:
    Sentence Embeddings using Siamese BERT-Networks", EMNLP, section 3), on NLI pairs as SBERT-NLI
    trains it (or QQP's duplicate / not duplicate).

    Inputs: pairs (premise, hypothesis) and their class y [b] (NLI: entailment, neutral,
    contradiction, ``data.nli.LABELS``). Both sentences go through the one encoder (a siamese
    network): u = f(premise), v = f(hypothesis) [b, D], and

        loss = mean_b CrossEntropy(W [u; v; |u - v|] + c, y),   W [C, 3D], C classes.

    The classifier (W, c: ``classifier``, PyTorch's default initialisation, as
    sentence-transformers' SoftmaxLoss) trains with the encoder; last/ keeps it for --resume, the
    encoder's checkpoint does not: SBERT throws it away after training. ``num_labels``: C.
    """

    def __init__(self, encoder, *, num_labels: int = 3, **settings):
        super().__init__(encoder, **settings)
        self.classifier = nn.Linear(3 * encoder.dim, num_labels)

    @classmethod
    def read_examples(cls, config, corpus) -> Examples:
        pairs = read_labelled(config, ("nli", "qqp"))
        return Examples([pairs.sentence1, pairs.sentence2], torch.tensor(pairs.labels, dtype=torch.long),
                        pairs.classes, f"{len(pairs):,} {pairs.kind} pairs from {', '.join(pairs.sources)}")

    @classmethod
    def from_examples(cls, examples: Examples) -> dict:
        return {"num_labels": len(examples.classes)}

    def logits(self, u, v) -> torch.Tensor:
        """[b, C] float32: the classifier on [u; v; |u - v|]."""
        features = torch.cat([u, v, (u - v).abs()], dim=-1).float()
        with torch.autocast(device_type=features.device.type, enabled=False):
            return self.classifier(features)

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        if labels is None:
            raise UsageError("sbert-softmax needs the pairs' classes (labels)")
        u, v = self.column_embeddings(ids, mask, 2, rank, world)
        y = self.local_labels(labels, ids.shape[0] // 2, rank, world)
        logits = self.logits(u, v)
        loss = F.cross_entropy(logits, y)
        with torch.no_grad():
            scalars = {"accuracy": (logits.argmax(-1) == y).float().mean(),
                       "pair_cosine": F.cosine_similarity(u.float(), v.float()).mean()}
        return loss, scalars
