"""TSDAE: a denoising auto-encoder whose decoder sees only the sentence vector."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert import pad_batch

from ..distributed import local_rows
from .base import IGNORE_INDEX, Objective, ensure_one, maskable_positions, setting


class TSDAEDecoder(nn.Module):
    """The decoder of TSDAE: a post-LayerNorm transformer decoder (``torch.nn.TransformerDecoder``,
    BERT-sized layers: the encoder's D, heads, feed-forward width, GELU, dropout) whose
    cross-attention sees one memory vector per sentence.

    forward(hidden [b, t, D] (embedded decoder input), memory [b, D], word_embeddings [V, D])
    -> logits [b, t, V] = decoder(hidden | memory) @ word_embeddings^T + bias. Causal
    self-attention; right padding needs no key-padding mask under it.
    """

    def __init__(self, config, num_layers: int):
        super().__init__()
        layer = nn.TransformerDecoderLayer(config.hidden_size, config.num_attention_heads, config.intermediate_size,
                                           dropout=config.hidden_dropout_prob, activation="gelu",
                                           layer_norm_eps=config.layer_norm_eps, batch_first=True, norm_first=False)
        self.layers = nn.TransformerDecoder(layer, num_layers)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # nn.TransformerDecoder clones one layer: give every layer its own BERT-style initialisation.
        for name, p in self.layers.named_parameters():
            if "norm" in name:
                continue
            if p.ndim >= 2:
                nn.init.normal_(p, std=config.initializer_range)
            else:
                nn.init.zeros_(p)

    def forward(self, hidden, memory, word_embeddings):
        t = hidden.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=hidden.device, dtype=hidden.dtype)
        h = self.layers(hidden, memory.unsqueeze(1).to(hidden.dtype), tgt_mask=causal, tgt_is_causal=True)
        return F.linear(h, word_embeddings, self.bias)


def kept_fraction(damaged_mask, mask, special) -> torch.Tensor:
    """Share of the non-special tokens that survived the deletion."""
    specials = (mask.bool() & special.bool()).sum()
    return (damaged_mask.sum() - specials.to(damaged_mask.device)) / maskable_positions(mask, special).sum().clamp_min(1)


class TSDAE(Objective):
    """Transformer-based Sequential Denoising Auto-Encoder (Wang et al. 2021, "TSDAE: Using
    Transformer-based Sequential Denoising Auto-Encoder for Unsupervised Sentence Embedding
    Learning", Findings of EMNLP).

    Noise: every non-special token is deleted with probability r (--deletion-ratio, 0.6;
    a sentence keeps at least one; [CLS]/[SEP] stay) -> damaged ids [b, t'] (t' <= t).
    The encoder maps the damaged sentence to its pooled vector u [b, D]; a transformer decoder
    (``decoder``, --decoder-layers) reconstructs the original with teacher forcing: its input
    is ids[:, :-1] embedded by the encoder's own embedding layer (word embeddings tied), its
    cross-attention sees only u, its output projection is the word-embedding matrix (tied) plus
    a bias, and it predicts ids[:, 1:]:

        loss = token cross-entropy over the real target tokens (padding ignored).
    """

    def __init__(self, encoder, args=None, generator=None):
        super().__init__(encoder, args, generator)
        self.deletion_ratio = float(setting(args, "deletion_ratio"))
        self.decoder = TSDAEDecoder(encoder.bert.config, int(setting(args, "decoder_layers")))

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
        embeddings = self.encoder.bert.embeddings
        hidden = embeddings(inputs, torch.zeros_like(inputs))
        logits = self.decoder(hidden, u, embeddings.word_embeddings.weight).float()
        # The mean over the global batch's target tokens (a rank's share of it under DDP).
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum") * (world / count)
        with torch.no_grad():
            valid = labels != IGNORE_INDEX
            scalars = {"token_accuracy": (logits.argmax(-1) == labels)[valid].float().mean(),
                       "kept_fraction": kept_fraction(damaged_mask, mask, special)}
        return loss, scalars
