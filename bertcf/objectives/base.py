"""The shape every pretraining objective has (``Objective``), the defaults of their settings, and
the helpers several of them use."""
from __future__ import annotations

import sys

import torch
import torch.nn as nn

from ..models.encoder import SentenceEncoder
from ..utils.distributed import is_main_process

IGNORE_INDEX = -100  # label of the positions a token cross-entropy skips

# Defaults of the objectives' flags (also used when an objective is built from a partial ``args``).
DEFAULTS = {"span_p": 0.3, "span_cap": 5, "temperature": 0.05, "negatives": "report", "span_unit": "token",
            "span_chars": 5, "pooling": "mean", "max_length": 32,
            "lambda_mirror": 0.3, "flow_blocks": 3, "flow_hidden": None, "flow_permutation": "lu",
            "flow_loss_unit": "bits-per-dim", "unfreeze_encoder": False, "encoder_lr": 1e-4,
            "momentum": 0.999, "predictor_k": 8, "predictor_hidden": None, "ct_negatives": 7,
            "deletion_ratio": 0.6, "mlm_probability": 0.15}


def setting(args, name: str):
    """``args.name``, or its default when ``args`` lacks it (or holds None)."""
    value = getattr(args, name, None) if args is not None else None
    return DEFAULTS[name] if value is None else value


def maskable_positions(mask, special) -> torch.Tensor:
    """[b, t] bool: the real, non-special tokens (what an objective may mask or delete)."""
    return mask.bool() & ~special.bool()


def ensure_one(selected, maskable, generator) -> torch.Tensor:
    """Rows that have maskable tokens but none selected get one selected at random."""
    empty = (~selected.any(1) & maskable.any(1)).nonzero().flatten().tolist()
    for i in empty:
        positions = maskable[i].nonzero().flatten()
        selected[i, positions[int(torch.randint(len(positions), (1,), generator=generator))]] = True
    return selected


@torch.no_grad()
def pair_scalars(a, b) -> dict:
    """Mean cosine of the positive pairs (row i of a and b) and of all other pairs in the batch."""
    cos = torch.nn.functional.normalize(a.float(), dim=-1) @ torch.nn.functional.normalize(b.float(), dim=-1).T
    n = cos.shape[0]
    return {"pos_cosine": cos.diagonal().mean(), "neg_cosine": (cos.sum() - cos.diagonal().sum()) / (n * n - n)}


class Objective(nn.Module):
    """One pretraining method, as one ``nn.Module`` that owns the encoder it trains (``encoder``,
    the one that is kept and evaluated) and every extra module its method needs.

    Built from ``encoder`` (a SentenceEncoder), ``args`` (run_pretrain.py's flags: any object with the
    attributes of ``objectives.add_args``; missing ones take their defaults) and ``generator``
    (the CPU torch.Generator of every random choice: views, pairs, deletions, masks; the pretraining
    run checkpoints its state, so a resumed run continues exactly).

    - ``objective(ids, mask, special, rank, world) -> (loss, scalars)``: one step's loss (``loss``);
    - ``parameter_groups()``: what the optimiser gets (groups may carry their own "lr");
    - ``checkpoint_modules()``: name -> module whose state ``last/training_state.pt`` keeps;
    - ``after_step()``: runs after every optimiser step (BSL's EMA update);
    - ``heldout_metrics(ids, mask, special)``: its own metrics on held-out sentences (MLM's accuracy).

    ``needs_text``: the objective also takes the batch's raw sentences (``texts``: a list of b
    strings), for views made on the text itself (Mirror-BERT's character span).

    ``uses_flow``: whether the encoder keeps its flow; the other objectives train the encoder
    itself, so a flow that ``--init`` carries is dropped.

    ``uses_dense``: whether the encoder keeps its linear head (``SentenceEncoder.dense``, e.g. a
    whitening map). Every objective here trains f(x) or a flow on it, which the head was fitted
    to, so a head that ``--init`` carries is dropped (with a note): refit it on the new encoder
    (``--stage whiten``). An objective that trains the head itself sets it."""

    uses_flow = False
    uses_dense = False
    needs_text = False

    def __init__(self, encoder: SentenceEncoder, args=None, generator: torch.Generator | None = None):
        super().__init__()
        if not self.uses_flow:
            encoder.flow = None
        if not self.uses_dense and encoder.dense is not None:
            if is_main_process():
                print(f"note: the encoder's linear head ({encoder.dim} -> {encoder.dense.out_features}, e.g. a "
                      f"whitening map) is dropped: this stage changes the vectors it was fitted on", file=sys.stderr)
            encoder.dense = None
        self.encoder = encoder
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        tokenizer = encoder.tokenizer
        self.mask_token_id = tokenizer.mask_token_id
        self.pad_token_id = tokenizer.pad_token_id

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    @property
    def encoder_frozen(self) -> bool:
        """True when no encoder weight trains (the joint and flow stages): its weights never change."""
        return not any(p.requires_grad for p in self.encoder.bert.parameters())

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def parameter_groups(self) -> list[dict]:
        return [{"params": self.trainable_parameters()}]

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        return {"objective": self}

    def embed(self, ids, mask) -> torch.Tensor:
        """f(x) [b, D] of a host batch, on the encoder's device; the mask's sum is counted on the
        host, so the unpadded encoder needs no GPU sync. No graph through a frozen encoder."""
        num_tokens = int(mask.sum())
        ids, mask = ids.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.encoder_frozen):
            return self.encoder.embed(ids, mask, num_tokens=num_tokens)

    def loss(self, ids, mask, special, rank: int = 0, world: int = 1, texts=None) -> tuple[torch.Tensor, dict]:
        """ids, mask, special: CPU [B, t] (token ids; 1 = real token; 1 = [CLS]/[SEP]/padding),
        the global batch; ``texts``: its B sentences (given when ``needs_text``). ``rank``, ``world``: this process's share under torch.distributed
        (rows ``local_rows(B, rank, world)``); every random choice is drawn for all B rows,
        only this share is encoded, and the loss is scaled so that its mean over the ranks is
        the whole batch's. Returns the scalar float32 loss and a dict of detached scalars to log
        (this rank's rows)."""
        raise NotImplementedError

    def forward(self, ids, mask, special, rank: int = 0, world: int = 1, texts=None):
        if self.needs_text:
            return self.loss(ids, mask, special, rank, world, texts=texts)
        return self.loss(ids, mask, special, rank, world)

    def heldout_metrics(self, ids, mask, special) -> dict:
        """The objective's own metrics on a held-out batch (CPU [b, t], as for ``loss``), logged
        with every evaluation; none by default."""
        return {}

    def after_step(self) -> None:
        """Called after every optimiser step."""
