"""Mirror-BERT and SimCSE: contrastive pretraining of the encoder on two views of each sentence."""
from __future__ import annotations

import torch

from ..contrastive import InfoNCE, span_mask
from ..distributed import local_rows
from .base import Objective, pair_scalars, setting


class Mirror(Objective):
    """Mirror-BERT (Liu et al. 2021, "Fast, Effective, and Self-Supervised: Transforming Masked
    Language Models into Universal Lexical and Sentence Encoders", EMNLP).

    Two views of each sentence x: x itself and x' = x with one token span replaced by [MASK]
    (span length ~ Geometric(--span-p) capped at --span-cap; ``span_mask``), both through the
    encoder with dropout, in one forward pass of 2b rows (dropout masks differ per row, so the
    views are independent). With u = f(x), u' = f(x') [b, D]:

        loss = InfoNCE(u, u') (cosine / --temperature, 2b - 1 candidates per anchor; under
        torch.distributed the candidates come from the global batch).
    """

    def __init__(self, encoder, args=None, generator=None):
        super().__init__(encoder, args, generator)
        self.span_p, self.span_cap = setting(args, "span_p"), setting(args, "span_cap")
        self.info_nce = InfoNCE(temperature=setting(args, "temperature"))

    def views(self, ids, mask, special, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the two views, u and u' [b, D]. The spans are drawn for the whole
        global batch, so the generator advances alike on every rank (and as in one process)."""
        masked = span_mask(ids, mask, special, self.mask_token_id, self.span_p, self.span_cap, self.generator)
        rows = local_rows(ids.shape[0], rank, world)
        ids, masked, mask = ids[rows], masked[rows], mask[rows]
        return self.embed(torch.cat([ids, masked]), torch.cat([mask, mask])).chunk(2)

    def checkpoint_modules(self):
        return {"encoder": self.encoder}  # no module of its own

    def loss(self, ids, mask, special, rank=0, world=1):
        u, u_masked = self.views(ids, mask, special, rank, world)
        return self.info_nce(u, u_masked), pair_scalars(u, u_masked)


class SimCSE(Mirror):
    """Unsupervised SimCSE (Gao et al. 2021, "SimCSE: Simple Contrastive Learning of Sentence
    Embeddings", EMNLP): Mirror-BERT without the span, so the two views differ by dropout only
    (--span-cap 0)."""

    def __init__(self, encoder, args=None, generator=None):
        super().__init__(encoder, args, generator)
        self.span_cap = 0
