"""BSL: bootstrapped sentence representations (BYOL for text), no negatives."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.encoder import pooled
from ..utils.distributed import dist_info, gather_with_grad, local_rows
from .base import Objective
from .contrastive import span_mask
from .settings import BSLSettings, SpanSettings


class GatheredBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d that, in training mode under torch.distributed, normalises with the statistics
    of the global batch: every rank's rows are gathered (``gather_with_grad``, so the gradient of
    every rank's loss reaches them), normalised together, and this rank's rows kept. Forward,
    running statistics and gradients are then one process's on the whole batch (``nn.SyncBatchNorm``
    does this on GPUs only). The parameters and buffers are BatchNorm1d's (same checkpoint keys).
    Every rank must pass the same number of rows."""

    def forward(self, x):
        rank, world = dist_info()
        if not self.training or world == 1:
            return super().forward(x)
        return super().forward(gather_with_grad(x))[local_rows(world * x.shape[0], rank, world)]


class BSL(Objective):
    """Bootstrapped sentence representation learning (Zhang et al. 2021, "Bootstrapped
    Unsupervised Sentence Representation Learning", ACL; BYOL, Grill et al. 2020, for text).

    Two views of each sentence: v1 = the sentence, v2 = one token span replaced by [MASK]
    (``span_mask``, --span-p / --span-cap); both go through dropout. The online encoder f
    (``encoder``, kept) and a predictor q (three linear layers D -> kD -> kD -> D with BatchNorm and
    ReLU between them, k = 8 as in the BSL paper; --predictor-k, --predictor-hidden) predict
    the target encoder's embedding of the other view; the target f_xi (``target``) is an
    exponential moving average of f, xi <- m xi + (1 - m) theta after every step (--momentum),
    and gets no gradient. It runs in the same train/eval mode as f (its dropout is part of
    the views). The predictor's BatchNorm normalises each view over the global batch under
    torch.distributed (``GatheredBatchNorm1d``; BYOL's cross-replica BatchNorm). With
    g(a, b) = 2 - 2 cos(a, b), per sentence [b]:

        L = g(q(f(v1)), sg f_xi(v2)) + g(q(f(v2)), sg f_xi(v1)),   loss = mean over the batch.

    No negatives. Shapes: f(v) [b, D] (the encoder's pooling), q: [b, D] -> [b, H] -> [b, H] -> [b, D].

    The predictor's BatchNorm couples the rows, so --mini-batch-size M uses the gradient cache
    (``objectives.cache``): f embeds the 2b views M rows at a time and the predictor and the loss
    run on all of them (BatchNorm's statistics, and its running averages, are the whole batch's);
    the target embeds M rows at a time without a graph.
    """

    mini_batches = True
    SETTINGS = (SpanSettings, BSLSettings)

    def __init__(self, encoder, **settings):
        super().__init__(encoder, **settings)
        d, s = encoder.dim, self.settings
        hidden = s.predictor_hidden or s.predictor_k * d
        self.momentum = float(s.momentum)
        self.span_p, self.span_cap = s.span_p, s.span_cap
        self.predictor = nn.Sequential(nn.Linear(d, hidden), GatheredBatchNorm1d(hidden), nn.ReLU(inplace=True),
                                       nn.Linear(hidden, hidden), GatheredBatchNorm1d(hidden), nn.ReLU(inplace=True),
                                       nn.Linear(hidden, d))
        self.target = copy.deepcopy(encoder.bert).requires_grad_(False)

    def views(self, ids, mask, special) -> torch.Tensor:
        """The second view: a copy of ids with one span per sentence masked."""
        return span_mask(ids, mask, special, self.mask_token_id, self.span_p, self.span_cap, self.generator)

    def target_embed(self, ids, mask, num_tokens) -> torch.Tensor:
        """f_xi(x) [b, D], the target encoder's vectors (device tensors)."""
        return pooled(self.target, ids, mask, self.encoder.pooling, num_tokens=num_tokens)

    @staticmethod
    def regression(prediction, target) -> torch.Tensor:
        """2 - 2 cos per row, [b]."""
        return 2 - 2 * F.cosine_similarity(prediction.float(), target.float(), dim=-1)

    def loss(self, ids, mask, special, rank=0, world=1):
        masked = self.views(ids, mask, special)
        rows = local_rows(ids.shape[0], rank, world)
        ids, masked, mask = ids[rows], masked[rows], mask[rows]
        both, both_mask = torch.cat([ids, masked]), torch.cat([mask, mask])
        o1, o2 = self.embed(both, both_mask).chunk(2)
        p1, p2 = self.predictor(o1), self.predictor(o2)  # BatchNorm statistics per view, as in BYOL
        t1, t2 = self.embed_rows(self.target_embed, both, both_mask, trainable=False).chunk(2)
        per_row = self.regression(p1, t2) + self.regression(p2, t1)
        with torch.no_grad():
            scalars = {"prediction_cosine": 1 - per_row.mean() / 4,
                       "view_cosine": F.cosine_similarity(o1.float(), o2.float(), dim=-1).mean()}
        return per_row.mean(), scalars

    @torch.no_grad()
    def after_step(self) -> None:
        """xi <- m xi + (1 - m) theta for every parameter; buffers are copied."""
        for target, online in zip(self.target.parameters(), self.encoder.bert.parameters()):
            target.lerp_(online.detach(), 1 - self.momentum)
        for target, online in zip(self.target.buffers(), self.encoder.bert.buffers()):
            target.copy_(online)
