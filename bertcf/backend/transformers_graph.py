"""A checkpoint's weights in transformers' ``BertModel``: the torch engine the bench sets beside
minBERT, and the export's ``--graph transformers`` (``export_transformers``): the graph a user
exporting transformers' model would write, which ``bench --onnx`` sets beside minBERT's.

transformers can express an encoder with mean or [CLS] pooling and no flow (``expressible``): its
BertModel (sdpa attention) takes minBERT's weights by name, then the pooling, the linear head and
Normalize follow as ``SentenceEncoder.encode`` applies them."""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


def expressible(encoder) -> bool:
    """Whether transformers' BertModel and a pooling give the encoder's vectors."""
    return encoder.flow is None and encoder.pooling in ("mean", "cls")


class TransformersEncoder:
    """transformers' BertModel (sdpa attention) of the same weights, pooled as the encoder pools
    (mean or [CLS]), then its linear head and Normalize where it has them: the torch reference
    from the ecosystem."""

    def __init__(self, encoder):
        import transformers

        if not expressible(encoder):
            raise ValueError("transformers' BertModel covers mean or [CLS] pooling without a flow")
        config = transformers.BertConfig.from_dict(encoder.bert.config.to_dict())
        config._attn_implementation = "sdpa"
        self.model = transformers.BertModel(config, add_pooling_layer=True).eval()
        self.model.load_state_dict(encoder.bert.state_dict(), strict=True)
        self.encoder = encoder

    def vectors(self, input_ids, attention_mask, normalize: bool = True):
        """The sentence vectors of a padded batch; ``normalize=False``: before Normalize."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).float()
        vector = hidden[:, 0] if self.encoder.pooling == "cls" else (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        if self.encoder.dense is not None:
            vector = self.encoder.dense(vector)
        return F.normalize(vector, dim=-1) if normalize and self.encoder.normalize else vector

    @torch.inference_mode()
    def encode(self, sentences, batch_size: int = 64):
        from minbert import pad_batch

        ids = self.encoder.token_ids(sentences)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out = torch.empty(len(ids), self.encoder.output_dim)
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            input_ids, mask = pad_batch([ids[i] for i in rows], self.encoder.tokenizer.pad_token_id)
            out[rows] = self.vectors(input_ids, mask).float()
        return out


class _Graph(nn.Module):
    """ids, mask -> sentence_embedding (and unnormalized_embedding when the encoder normalises), as
    the export's minBERT graph."""

    def __init__(self, engine: TransformersEncoder):
        super().__init__()
        self.engine = engine
        self.model = engine.model

    def forward(self, input_ids, attention_mask):
        vector = self.engine.vectors(input_ids, attention_mask, normalize=False)
        if self.engine.encoder.normalize:
            return F.normalize(vector, dim=-1), vector
        return vector


def export_transformers(engine: TransformersEncoder, path: Path, outputs: list[str], opset: int = 17) -> None:
    """torch.onnx's TorchScript exporter on transformers' BertModel and the pooling, the batch and
    sequence axes dynamic: the graph as a user exporting transformers' model would write it
    (standard operators; each layer's Q, K and V its own MatMul)."""
    inputs = engine.encoder.tokenize(["A man is playing a guitar.", "Hello"])
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Graph(engine).eval(), (inputs["input_ids"], inputs["attention_mask"]), str(path),
                          input_names=list(axes), output_names=outputs, dynamic_axes=axes, opset_version=opset,
                          dynamo=False)
