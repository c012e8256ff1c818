"""TSDAE: a denoising auto-encoder whose decoder sees only the sentence vector."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert import pad_batch
from minbert.model import BertSelfOutput

from ..utils.distributed import local_rows
from .base import IGNORE_INDEX, Objective, ensure_one, maskable_positions
from .mlm import MLMHead
from .settings import TSDAESettings


class CrossAttention(nn.Module):
    """BERT's cross-attention (Hugging Face's names: ``self.query|key|value``, ``output.dense``,
    ``output.LayerNorm``): the decoder's tokens x [b, t, D] attend to the memory [b, m, D]; output
    projection, dropout, residual and post-LayerNorm as in the self-attention."""

    def __init__(self, config):
        super().__init__()
        self.num_heads, self.dropout_p = config.num_attention_heads, config.attention_probs_dropout_prob
        self.self = nn.Module()
        for name in ("query", "key", "value"):
            setattr(self.self, name, nn.Linear(config.hidden_size, config.hidden_size))
        self.output = BertSelfOutput(config)

    def forward(self, x, memory):
        heads = lambda z: z.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)  # noqa: E731 - [b, heads, *, hd]
        y = F.scaled_dot_product_attention(heads(self.self.query(x)), heads(self.self.key(memory)),
                                           heads(self.self.value(memory)),
                                           dropout_p=self.dropout_p if self.training else 0.0)
        return self.output(y.transpose(1, 2).flatten(2), x)


class TSDAEDecoder(nn.Module):
    """TSDAE's decoder, as the paper and sentence-transformers' ``DenoisingAutoEncoderLoss`` (with
    ``tie_encoder_decoder``) build it: the encoder's own BERT run as a causal decoder, its
    embeddings and every layer's self-attention and feed-forward weights shared with the encoder,
    with a cross-attention (``cross``) added after each layer's self-attention, and BERT's
    LM head (``head``: transform, LayerNorm, the word embeddings tied, a bias).

    forward(bert (the encoder's minBERT), ids [b, t], memory [b, D]) -> logits [b, t, V]."""

    def __init__(self, config):
        super().__init__()
        self.cross = nn.ModuleList(CrossAttention(config) for _ in range(config.num_hidden_layers))
        self.head = MLMHead(config)
        for module in self.cross.modules():  # BERT's initialisation
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=config.initializer_range)
                nn.init.zeros_(module.bias)

    def forward(self, bert, ids, memory):
        t = ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()  # True: may attend
        h = bert.embeddings(ids, torch.zeros_like(ids))
        for layer, cross in zip(bert.encoder.layer, self.cross):
            h = layer.attention.output(layer.attention.self(h, causal), h)
            h = cross(h, memory[:, None].to(h.dtype))
            h = layer.output(layer.intermediate(h), h)
        return self.head(h, bert.embeddings.word_embeddings.weight)


def kept_fraction(damaged_mask, mask, special) -> torch.Tensor:
    """Share of the non-special tokens that survived the deletion."""
    specials = (mask.bool() & special.bool()).sum()
    return (damaged_mask.sum() - specials.to(damaged_mask.device)) / maskable_positions(mask, special).sum().clamp_min(1)


class TSDAE(Objective):
    """Transformer-based Sequential Denoising Auto-Encoder (Wang et al. 2021, "TSDAE: Using
    Transformer-based Sequential Denoising Auto-Encoder for Unsupervised Sentence Embedding
    Learning", Findings of EMNLP).

    Noise: every non-special token is deleted with probability r (--deletion-ratio, 0.6;
    a sentence keeps at least one; [CLS]/[SEP] stay) -> damaged ids [b, t'] (t' <= t). (TSDAE
    deletes words; this deletes word pieces, so it works on the token ids.) The encoder maps the
    damaged sentence to its pooled vector u [b, D]; the decoder (``TSDAEDecoder``: the encoder's
    BERT, tied, run causally, with cross-attention to u alone) reconstructs the original with
    teacher forcing from ids[:, :-1] and predicts ids[:, 1:]:

        loss = token cross-entropy over the real target tokens (padding ignored),

    which equals sentence-transformers' DenoisingAutoEncoderLoss with tie_encoder_decoder
    (tests/objectives/test_reference.py).
    """

    SETTINGS = (TSDAESettings,)

    def __init__(self, encoder, **settings):
        super().__init__(encoder, **settings)
        self.deletion_ratio = float(self.settings.deletion_ratio)
        self.decoder = TSDAEDecoder(encoder.bert.config)

    def delete(self, ids, mask, special) -> tuple[torch.Tensor, torch.Tensor]:
        """The damaged batch (ids, mask), right-padded to its longest sentence."""
        maskable = maskable_positions(mask, special)
        keep = (torch.rand(ids.shape, generator=self.generator) >= self.deletion_ratio) & maskable
        keep = ensure_one(keep, maskable, self.generator)
        keep |= mask.bool() & special.bool()  # [CLS] and [SEP]
        return pad_batch([row[k].tolist() for row, k in zip(ids, keep)], self.pad_token_id)

    def loss(self, ids, mask, special, rank=0, world=1):
        damaged, damaged_mask = self.delete(ids, mask, special)
        count = max(int(mask[:, 1:].sum()), 1)  # target tokens of the global batch
        rows = local_rows(ids.shape[0], rank, world)
        ids, mask, special, damaged, damaged_mask = (x[rows] for x in (ids, mask, special, damaged, damaged_mask))
        u = self.embed(damaged, damaged_mask)
        original, original_mask = ids.to(self.device), mask.to(self.device)
        inputs = original[:, :-1]
        labels = original[:, 1:].masked_fill(original_mask[:, 1:] == 0, IGNORE_INDEX)
        logits = self.decoder(self.encoder.bert, inputs, u).float()
        # The mean over the global batch's target tokens (a rank's share of it under DDP).
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum") * (world / count)
        with torch.no_grad():
            valid = labels != IGNORE_INDEX
            scalars = {"token_accuracy": (logits.argmax(-1) == labels)[valid].float().mean(),
                       "kept_fraction": kept_fraction(damaged_mask, mask, special)}
        return loss, scalars
