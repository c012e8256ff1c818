"""Masked language modelling (BERT's own objective), as continued pretraining."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert import CheckpointError
from minbert.model import ACTIVATIONS, has_weights, load_state_dict_file, resolve_checkpoint

from ..runs import resolve_encoder_path
from ..utils.distributed import is_main_process, local_rows
from .base import IGNORE_INDEX, Objective, ensure_one, maskable_positions
from .settings import MLMSettings


class MLMHead(nn.Module):
    """BERT's masked-LM prediction head (Hugging Face names, under ``cls.predictions.``):
    transform = dense D x D, activation, LayerNorm; decoder = the word embeddings (tied) + bias.

    forward(hidden [n, D], word_embeddings [V, D]) -> logits [n, V]."""

    def __init__(self, config):
        super().__init__()
        self.transform = nn.Module()
        self.transform.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.act = ACTIVATIONS[config.hidden_act]
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        nn.init.normal_(self.transform.dense.weight, std=config.initializer_range)
        nn.init.zeros_(self.transform.dense.bias)

    def forward(self, hidden, word_embeddings):
        h = self.transform.LayerNorm(self.act(self.transform.dense(hidden)))
        return F.linear(h, word_embeddings, self.bias)

    def load_checkpoint_tensors(self, state_dict: dict, source: str = "checkpoint") -> bool:
        """Copy ``cls.predictions.*`` of a BertForMaskedLM / BertForPreTraining state dict;
        False (head left as it is) when the checkpoint has no complete head."""
        prefix = "cls.predictions."
        found = {}
        for key, tensor in state_dict.items():
            if key.startswith(prefix):
                name = key[len(prefix):].replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
                found[name] = tensor
        if "bias" not in found and "decoder.bias" in found:
            found["bias"] = found["decoder.bias"]
        own = self.state_dict()
        if not set(own) <= set(found):
            return False
        bad = [f"{k} {tuple(found[k].shape)} != {tuple(v.shape)}" for k, v in own.items() if found[k].shape != v.shape]
        if bad:
            raise CheckpointError(f"the MLM head of {source} does not fit the encoder ({'; '.join(bad)})")
        self.load_state_dict({k: found[k].to(v.dtype) for k, v in own.items()})
        return True


class MaskedLM(Objective):
    """Masked language modelling for domain adaptation (Devlin et al. 2019, "BERT"; as
    continued pretraining: Gururangan et al. 2020, "Don't Stop Pretraining").

    Each non-special token is selected with probability p (--mlm-probability, 0.15; at least
    one per sentence); a selected token becomes [MASK] with probability 0.8, a random
    vocabulary token with 0.1, and stays itself with 0.1. The encoder's last layer at the
    selected positions [n, D] goes through ``head`` (``MLMHead``, initialised from the
    checkpoint's ``cls.predictions.*`` when it has them, else fresh) -> logits [n, V]:

        loss = cross-entropy of the original tokens at the selected positions only.

    ``checkpoint``: where the encoder came from (a directory, hub name or run), whose MLM head
    initialises ``head`` (``run_pretrain.py`` gives --init or --model).
    """

    SETTINGS = (MLMSettings,)
    RUN_SETTINGS = ("checkpoint",)

    def __init__(self, encoder, *, checkpoint=None, **settings):
        super().__init__(encoder, **settings)
        self.probability = float(self.settings.mlm_probability)
        config = encoder.bert.config
        self.vocab_size = config.vocab_size
        self.head = MLMHead(config)
        self.head_from_checkpoint = self.init_head(checkpoint) if checkpoint is not None else False

    def init_head(self, checkpoint) -> bool:
        """Initialise the head from ``checkpoint`` (directory, hub name or run directory); a
        config-only directory (random weights, pretraining from scratch) has none to give."""
        source = resolve_encoder_path(checkpoint)
        loaded = False
        if not (Path(source).is_dir() and not has_weights(source)):
            _, weights = resolve_checkpoint(source)
            loaded = self.head.load_checkpoint_tensors(load_state_dict_file(weights), source=str(checkpoint))
        if is_main_process():  # one line a run, not one a rank
            how = "initialised from" if loaded else "freshly initialised; no cls.predictions in"
            print(f"mlm: prediction head {how} {checkpoint}")
        return loaded

    def mask_tokens(self, ids, mask, special, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [b, t], labels [b, t]): labels hold the original id at the selected
        positions and IGNORE_INDEX elsewhere. ``generator``: default the objective's."""
        g = generator if generator is not None else self.generator
        maskable = maskable_positions(mask, special)
        selected = (torch.rand(ids.shape, generator=g) < self.probability) & maskable
        selected = ensure_one(selected, maskable, g)
        action = torch.rand(ids.shape, generator=g)
        random_ids = torch.randint(self.vocab_size, ids.shape, generator=g)
        inputs = torch.where(selected & (action < 0.8), self.mask_token_id, ids)
        inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
        labels = torch.where(selected, ids, IGNORE_INDEX)
        return inputs, labels

    def predict(self, inputs, mask, labels) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [n, V] float32, targets [n]) at the n selected positions of a device batch."""
        hidden = self.encoder.bert(inputs, mask)["last_hidden_state"]
        selected = labels != IGNORE_INDEX
        logits = self.head(hidden[selected], self.encoder.bert.embeddings.word_embeddings.weight).float()
        return logits, labels[selected]

    def loss(self, ids, mask, special, rank=0, world=1):
        inputs, labels = self.mask_tokens(ids, mask, special)
        count = max(int((labels != IGNORE_INDEX).sum()), 1)  # selected tokens of the global batch
        rows = local_rows(ids.shape[0], rank, world)
        inputs, mask, labels = inputs[rows].to(self.device), mask[rows].to(self.device), labels[rows].to(self.device)
        logits, targets = self.predict(inputs, mask, labels)
        loss = F.cross_entropy(logits, targets, reduction="sum") * (world / count)  # the global batch's mean
        with torch.no_grad():
            scalars = {"mlm_accuracy": (logits.argmax(-1) == targets).float().mean(),
                       "masked_fraction": (labels != IGNORE_INDEX).sum() / mask.sum()}
        return loss, scalars

    @torch.no_grad()
    def heldout_metrics(self, ids, mask, special) -> dict:
        """The MLM loss and masked-token accuracy on held-out sentences, in eval mode, with the
        same masks at every evaluation (a generator of its own, seed 0)."""
        inputs, labels = self.mask_tokens(ids, mask, special, torch.Generator().manual_seed(0))
        was_training = self.training
        self.eval()
        try:
            logits, targets = self.predict(inputs.to(self.device), mask.to(self.device), labels.to(self.device))
        finally:
            self.train(was_training)
        return {"mlm_heldout_loss": F.cross_entropy(logits, targets).item(),
                "mlm_heldout_accuracy": (logits.argmax(-1) == targets).float().mean().item()}
