"""``--onnx``'s engines: what each change to the graph gives, measured in one run beside the
exported checkpoint in torch and a plain export of transformers' BertModel of the same weights.

Each engine has ``encode(sentences, batch_size)`` (tokenisation, length-sorted batches, rows in
input order): minBERT in torch (``SentenceEncoder``), transformers' BertModel in torch, and ONNX
Runtime on these graphs, each written into a scratch copy of the export:

    minBERT plain        ``scaled_dot_product_attention`` as the exporter writes it (standard operators)
    minBERT fused        each layer's attention as the ``Attention`` contrib operator (the export's default)
    ... int8             ONNX Runtime's dynamic quantisation (int8 weights, activations per batch):
                         per tensor; per channel; or the attention left in float (MatMul only: what
                         ``bertcf-export onnx --quantize int8`` writes)
    transformers export  the TorchScript export of transformers' BertModel with the same pooling
                         (and Normalize), as a user would write it; then its int8 form, and ONNX
                         Runtime's transformer optimizer on it (its BERT fusions)
"""
from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..backend.onnx_export import INT8_OPTIONS

#: name -> (attention, quantisation keywords, or None for the float graph)
MINBERT_VARIANTS = {
    "minBERT plain fp32": ("plain", None),
    "minBERT plain int8": ("plain", {}),
    "minBERT fused fp32": ("fused", None),
    "minBERT fused int8": ("fused", {}),
    "minBERT fused int8 per-channel": ("fused", {"per_channel": True}),
    "minBERT fused int8 (attention in fp32)": ("fused", INT8_OPTIONS),  # the export's int8 graph
}


class TransformersEncoder:
    """transformers' BertModel (sdpa attention) of the same weights, pooled as the encoder pools
    (mean or [CLS]), then its linear head and Normalize where it has them: the torch reference
    from the ecosystem."""

    def __init__(self, encoder):
        import transformers

        if encoder.flow is not None or encoder.pooling not in ("mean", "cls"):
            raise ValueError("the transformers engines cover mean or [CLS] pooling without a flow")
        config = transformers.BertConfig.from_dict(encoder.bert.config.to_dict())
        config._attn_implementation = "sdpa"
        self.model = transformers.BertModel(config, add_pooling_layer=True).eval()
        self.model.load_state_dict(encoder.bert.state_dict(), strict=True)
        self.encoder = encoder

    def vectors(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).float()
        vector = hidden[:, 0] if self.encoder.pooling == "cls" else (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        if self.encoder.dense is not None:
            vector = self.encoder.dense(vector)
        return F.normalize(vector, dim=-1) if self.encoder.normalize else vector

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


class _TransformersGraph(nn.Module):
    def __init__(self, engine: TransformersEncoder):
        super().__init__()
        self.engine = engine
        self.model = engine.model

    def forward(self, input_ids, attention_mask):
        return self.engine.vectors(input_ids, attention_mask)


def export_transformers(engine: TransformersEncoder, path: Path) -> None:
    """The TorchScript export of transformers' BertModel and the pooling (opset 17), the batch and
    sequence axes dynamic: how the graph looks when a user exports the model as transformers has it."""
    inputs = engine.encoder.tokenize(["A man is playing a guitar.", "Hello"])
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_TransformersGraph(engine).eval(), (inputs["input_ids"], inputs["attention_mask"]),
                          str(path), input_names=list(axes), output_names=["sentence_embedding"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)


def optimize_transformers(source: Path, target: Path, config) -> None:
    """ONNX Runtime's offline transformer optimizer (model_type bert) on the transformers export."""
    from onnxruntime.transformers import optimizer

    logging.disable(logging.WARNING)
    try:
        optimizer.optimize_model(str(source), model_type="bert", num_heads=config.num_attention_heads,
                                 hidden_size=config.hidden_size).save_model_to_file(str(target))
    finally:
        logging.disable(logging.NOTSET)


def build(export_dir: Path, encoder, scratch: Path) -> dict[str, Path]:
    """Every variant graph, written into ``scratch`` (a copy of the export, for its tokenizer and
    settings): name -> its file there."""
    from ..backend.onnx_export import SentenceGraph, example_inputs, export_graph, output_names, quantize

    shutil.copytree(export_dir, scratch, dirs_exist_ok=True)
    config = encoder.bert.config
    graphs = {}
    for name, (attention, quantized) in MINBERT_VARIANTS.items():
        fp32 = scratch / f"minbert-{attention}.onnx"
        if not fp32.is_file():
            export_graph(SentenceGraph(encoder).eval(), example_inputs(encoder), output_names(encoder), fp32, 18,
                         config.max_position_embeddings, attention)
        graphs[name] = fp32 if quantized is None else scratch / f"{''.join(c if c.isalnum() else '-' for c in name)}.onnx"
        if quantized is not None:
            quantize(fp32, graphs[name], **quantized)
    try:
        engine = TransformersEncoder(encoder)
    except ValueError:
        return graphs
    plain, optimized = scratch / "transformers.onnx", scratch / "transformers-optimized.onnx"
    export_transformers(engine, plain)
    optimize_transformers(plain, optimized, config)
    for label, path in (("transformers export", plain), ("transformers export + ORT optimizer", optimized)):
        graphs[f"{label} fp32"] = path
        graphs[f"{label} int8"] = path.with_name(path.stem + "-int8.onnx")
        quantize(path, graphs[f"{label} int8"])
    return graphs


def operator_counts(path: Path, kinds=("Attention", "QAttention", "SkipLayerNormalization", "BiasGelu",
                                       "FastGelu", "Gelu", "EmbedLayerNormalization", "MatMulInteger")) -> dict:
    """How many of ONNX Runtime's fused (and int8) operators the graph holds."""
    import onnx

    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    return {k: ops.count(k) for k in kinds if ops.count(k)}
