"""The flow objectives: BERT-CF's joint loss (the report's contribution) and the flow alone."""
from __future__ import annotations

import sys

import torch

from ..models.flow import ActNorm, Glow, flow_loss, gaussian_nll
from ..utils.distributed import is_main_process, local_rows
from .base import Objective, pair_scalars
from .mirror import Mirror
from .settings import FlowSettings, InfoNCESettings, JointLossSettings, SpanSettings


def attach_flow(encoder, settings) -> Glow:
    """The encoder's flow: a fresh Glow (``settings``: flow_blocks, flow_hidden, flow_permutation),
    or the one --init carries, which trains on (a note says so when the settings ask for another)."""
    blocks, permutation = settings.flow_blocks, settings.flow_permutation
    hidden = settings.flow_hidden or encoder.dim
    if encoder.flow is None:
        encoder.flow = Glow(encoder.dim, num_blocks=blocks, hidden=hidden, permutation=permutation)
    elif is_main_process() and (encoder.flow.num_blocks, encoder.flow.hidden, encoder.flow.permutation) != (
            blocks, hidden, permutation):
        print(f"note: --init already has a flow ({encoder.flow.num_blocks} blocks, coupling width "
              f"{encoder.flow.hidden}, {encoder.flow.permutation} permutation); training it on, so --flow-blocks "
              f"{blocks}, --flow-hidden {hidden} and --flow-permutation {permutation} do not apply", file=sys.stderr)
    return encoder.flow


def flow_scalars(nll, z, logdet, dim: int) -> dict:
    """L_flow in both units, whichever one trains, and the latents' scale."""
    nll = nll.detach()
    return {"l_flow_nats": flow_loss(nll, dim, "nats"), "l_flow_bits_per_dim": flow_loss(nll, dim, "bits-per-dim"),
            "logdet": logdet.detach().mean(), "latent_norm": z.detach().norm(dim=-1).mean()}


class FlowOnly(Objective):
    """The flow alone on the frozen encoder (BERT-flow, Li et al. 2020, "On the Sentence Embeddings
    from Pre-trained Language Models", EMNLP): the report's MinBERT-flow and Mirror-flow.

    u = f(x) [b, D] (one view, dropout on as in training), (z, logdet) = flow(u):

        loss = L_flow = mean_b NLL(u) = mean_b [0.5 ||z||^2 + 0.5 D ln 2 pi - logdet], in bits per
        dimension (/ (D ln 2), the default) or nats (--flow-loss-unit).

    --mini-batch-size M: the frozen encoder embeds M rows at a time (inference: nothing to cache);
    the flow runs on the whole batch.
    """

    uses_flow = True
    mini_batches = True
    SETTINGS = (FlowSettings,)

    def __init__(self, encoder, **settings):
        super().__init__(encoder, **settings)
        self.flow = attach_flow(encoder, self.settings)
        self.unit = self.settings.flow_loss_unit
        encoder.bert.requires_grad_(False)

    def checkpoint_modules(self):
        return {"flow": self.flow}  # the frozen encoder is in last/model.safetensors

    def loss(self, ids, mask, special, rank=0, world=1):
        rows = local_rows(ids.shape[0], rank, world)
        z, logdet = self.flow(self.embed(ids[rows], mask[rows]))
        nll = gaussian_nll(z, logdet)
        return flow_loss(nll, self.encoder.dim, self.unit), flow_scalars(nll, z, logdet, self.encoder.dim)


class Joint(Mirror):
    """BERT-CF: the flow learned with the contrastive loss as a regulariser (the report, section 4.2).

    The two views of Mirror-BERT (or SimCSE's, --method simcse) go through the encoder f and the
    flow: z = F(x), z' = F(x') [b, D], with u = f(x):

        loss = lambda * InfoNCE(z, z') + L_flow(u),   lambda = --lambda-mirror (0.3),

    L_flow as in ``FlowOnly`` (bits per dimension by default, the unit of the BERT-flow code the
    report cites; in nats the contrastive term is D ln 2 times lighter). The encoder is frozen;
    with --unfreeze-encoder (MinBERT-joint) L_mirror trains it too, at its own --encoder-lr, and
    L_flow sees u.detach(), so it models the encoder's embeddings without moving them.

    --mini-batch-size M: the frozen encoder embeds the 2b views M rows at a time, without a graph,
    so there is nothing to cache: the flow, the only thing that trains, runs on all 2b vectors,
    and its activations (O(b D) a block) are small beside the encoder's (O(b t D) a layer). With
    --unfreeze-encoder, L_mirror's gradient reaches the encoder through the gradient cache
    (``objectives.cache``), the flow and both terms of the loss unchanged.
    """

    uses_flow = True
    SETTINGS = (SpanSettings, InfoNCESettings, FlowSettings, JointLossSettings)

    def __init__(self, encoder, **settings):
        super().__init__(encoder, **settings)
        s = self.settings
        self.flow = attach_flow(encoder, s)
        self.lambda_mirror, self.unit, self.encoder_lr = s.lambda_mirror, s.flow_loss_unit, s.encoder_lr
        self.train_encoder = bool(s.unfreeze_encoder)
        encoder.bert.requires_grad_(self.train_encoder)
        self._actnorm_ready = not self.train_encoder  # checked at the first step (after any --resume)

    def parameter_groups(self):
        flow = [p for p in self.flow.parameters() if p.requires_grad]
        if not self.train_encoder:
            return [{"params": flow}]
        return [{"params": flow}, {"params": list(self.encoder.bert.parameters()), "lr": self.encoder_lr}]

    def checkpoint_modules(self):
        return {"encoder": self.encoder} if self.train_encoder else {"flow": self.flow}

    def loss(self, ids, mask, special, rank=0, world=1, texts=None):
        u, u_masked = self.views(ids, mask, special, rank, world, texts)
        if self.train_encoder:
            if not self._actnorm_ready:
                # ActNorm's data-dependent initialisation sees the two views, as with a frozen
                # encoder, not the three-part batch of the call below.
                if any(isinstance(m, ActNorm) and not bool(m.initialized) for m in self.flow.modules()):
                    with torch.no_grad():
                        self.flow(torch.cat([u, u_masked]))
                self._actnorm_ready = True
            # One flow call for all three parts, so DDP sees one forward per step.
            z_all, logdet_all = self.flow(torch.cat([u, u_masked, u.detach()]))
            z, z_masked, z_flow = z_all.chunk(3)
            logdet = logdet_all.chunk(3)[2]
        else:
            z_both, logdet_both = self.flow(torch.cat([u, u_masked]))
            z, z_masked = z_both.chunk(2)
            z_flow, logdet = z, logdet_both.chunk(2)[0]
        nll = gaussian_nll(z_flow, logdet)
        l_mirror = self.info_nce(z, z_masked)
        scalars = flow_scalars(nll, z, logdet, self.encoder.dim) | pair_scalars(z, z_masked) | {
            "l_mirror": l_mirror.detach()}
        return self.lambda_mirror * l_mirror + flow_loss(nll, self.encoder.dim, self.unit), scalars
