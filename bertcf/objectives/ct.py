"""Contrastive Tension: two encoders, trained to agree on a sentence and disagree on others."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ..models.encoder import pooled
from ..utils.distributed import local_rows
from .base import Objective
from .settings import CTSettings


class ContrastiveTension(Objective):
    """Contrastive Tension (Carlsson et al. 2021, "Semantic Re-tuning with Contrastive
    Tension", ICLR).

    Two copies of the encoder, identical at the start and trained independently: f1
    (``encoder``, kept) and f2 (``second``). A batch of b sentences gives b pairs (A_i, B_i):
    A_i = sentence i; every (k + 1)-th pair (i % (k + 1) == 0, k = --ct-negatives) is a positive
    with B_i = A_i and label 1, the others take another sentence of the batch, drawn uniformly,
    with label 0 (one positive per 8 pairs by default). With s_i = f1(A_i) . f2(B_i) [b]:

        loss = mean_i BCEWithLogits(s_i, y_i).

    (sentence-transformers' ContrastiveTensionLoss sums over the batch; the mean keeps the
    learning rate independent of the batch size.)

    The pairs do not couple the rows; --mini-batch-size M still bounds the memory of the two
    encoders' passes, through the gradient cache (``objectives.cache``): f1 and f2 embed M rows at
    a time, the loss runs on all b pairs. (The last chunk of f1's pass keeps its activations until
    its backward, after f2's chunks: M rows of each encoder at most.)
    """

    mini_batches = True

    SETTINGS = (CTSettings,)

    def __init__(self, encoder, **settings):
        super().__init__(encoder, **settings)
        self.negatives = int(self.settings.ct_negatives)
        self.second = copy.deepcopy(encoder.bert).requires_grad_(True)

    def pairs(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(partner [b] long, labels [b] float): B_i = sentence partner[i]."""
        rows = torch.arange(b)
        labels = (rows % (self.negatives + 1) == 0).float()
        other = torch.randint(0, max(b - 1, 1), (b,), generator=self.generator)
        other = other + (other >= rows).long()  # uniform over the b - 1 other sentences
        partner = torch.where(labels.bool() | (b < 2), rows, other)
        return partner, labels

    def second_embed(self, ids, mask, num_tokens) -> torch.Tensor:
        """f2(x) [b, D], the second encoder's vectors (device tensors)."""
        return pooled(self.second, ids, mask, self.encoder.pooling, num_tokens=num_tokens)

    def loss(self, ids, mask, special, rank=0, world=1):
        partner, labels = self.pairs(ids.shape[0])  # over the global batch: B_i may be another rank's row
        rows = local_rows(ids.shape[0], rank, world)
        partner, labels = partner[rows], labels[rows]
        a = self.embed(ids[rows], mask[rows])
        b = self.embed_rows(self.second_embed, ids[partner], mask[partner])
        logits = (a.float() * b.float()).sum(-1)
        labels = labels.to(logits.device)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        with torch.no_grad():
            pos, neg = labels.bool(), ~labels.bool()
            scalars = {"pos_logit": logits[pos].mean(), "neg_logit": logits[neg].mean() if neg.any() else logits.new_zeros(()),
                       "pair_accuracy": ((logits > 0).float() == labels).float().mean()}
        return loss, scalars
