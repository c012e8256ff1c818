"""``--onnx``'s engines: what each change to the graph gives, measured in one run beside the
exported checkpoint in torch and a plain export of transformers' BertModel of the same weights.

Each engine has ``encode(sentences, batch_size)`` (tokenisation, length-sorted batches, rows in
input order): minBERT in torch (``SentenceEncoder``), transformers' BertModel in torch, and ONNX
Runtime on these graphs, each written into a scratch copy of the export:

    minBERT plain        ``scaled_dot_product_attention`` as the exporter writes it (standard operators)
    minBERT fused        each layer's attention as the ``Attention`` contrib operator (``--graph minbert``'s default)
    ... int8             ONNX Runtime's dynamic quantisation (int8 weights, activations per batch):
                         per tensor; per channel; or the attention left in float (MatMul only: what
                         ``bertcf-export onnx --graph minbert --quantize int8`` writes)
    ... int8 static      static quantisation (QDQ: each MatMul's activations in a uint8 range fixed
                         once on calibration sentences, STS-B train's, not the test set timed), the
                         attention's products in float; the plain graph's Q/K/V projections quantised
    transformers export  the TorchScript export of transformers' BertModel with the same pooling
                         (and Normalize), as a user would write it: what ``bertcf-export onnx`` writes
                         by default for an encoder transformers can express (``--graph transformers``);
                         then its int8 form (the export's), and ONNX Runtime's transformer optimizer
                         on it (its BERT fusions)
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..backend.onnx_export import DEFAULT_OPSET, INT8_OPTIONS
from ..backend.transformers_graph import expressible

#: name -> (attention, quantisation keywords, or None for the float graph)
MINBERT_VARIANTS = {
    "minBERT plain fp32": ("plain", None),
    "minBERT plain int8": ("plain", {}),
    "minBERT fused fp32": ("fused", None),
    "minBERT fused int8": ("fused", {}),
    "minBERT fused int8 per-channel": ("fused", {"per_channel": True}),
    "minBERT fused int8 (attention in fp32)": ("fused", INT8_OPTIONS),  # the export's int8 graph
}
#: name -> (attention, quantize_static_graph's keywords)
STATIC_VARIANTS = {
    "minBERT fused int8 static (attention in fp32)": ("fused", {}),
    "minBERT fused int8 static per-channel (attention in fp32)": ("fused", {"per_channel": True}),
    "minBERT plain int8 static (scores in fp32)": ("plain", {}),
    "minBERT plain int8 static (all MatMuls)": ("plain", {"exclude_activation_products": False}),
}
CALIBRATION_SENTENCES = 320  # STS-B train's first, in batches of 32


def calibration_batches(encoder, sentences: list[str], batch_size: int = 32) -> list[dict]:
    """The graphs' inputs for ``sentences`` (padded batches, as numpy), for static quantisation."""
    from minbert import pad_batch

    ids = encoder.token_ids(sentences)
    batches = []
    for start in range(0, len(ids), batch_size):
        input_ids, mask = pad_batch(ids[start:start + batch_size], encoder.tokenizer.pad_token_id)
        batches.append({"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})
    return batches


def optimize_transformers(source: Path, target: Path, config) -> None:
    """ONNX Runtime's offline transformer optimizer (model_type bert) on the transformers export."""
    from onnxruntime.transformers import optimizer

    logging.disable(logging.WARNING)
    try:
        optimizer.optimize_model(str(source), model_type="bert", num_heads=config.num_attention_heads,
                                 hidden_size=config.hidden_size).save_model_to_file(str(target))
    finally:
        logging.disable(logging.NOTSET)


def _file(scratch: Path, name: str) -> Path:
    return scratch / f"{''.join(c if c.isalnum() else '-' for c in name)}.onnx"


def build(export_dir: Path, encoder, scratch: Path, calibration: list[str]) -> dict[str, Path]:
    """Every variant graph, written into ``scratch`` (a copy of the export, for its tokenizer and
    settings): name -> its file there. ``calibration``: the static variants' sentences."""
    from ..backend.onnx_export import quantize, quantize_static_graph, write_graph

    shutil.copytree(export_dir, scratch, dirs_exist_ok=True)
    graphs = {}

    def fp32(attention: str) -> Path:
        path = scratch / f"minbert-{attention}.onnx"
        if not path.is_file():
            write_graph(encoder, path, "minbert", attention, DEFAULT_OPSET)
        return path

    for name, (attention, quantized) in MINBERT_VARIANTS.items():
        graphs[name] = fp32(attention) if quantized is None else _file(scratch, name)
        if quantized is not None:
            quantize(fp32(attention), graphs[name], **quantized)
    batches = calibration_batches(encoder, calibration)
    for name, (attention, options) in STATIC_VARIANTS.items():
        graphs[name] = _file(scratch, name)
        quantize_static_graph(fp32(attention), graphs[name], batches, **options)
    if not expressible(encoder):
        return graphs
    plain, optimized = scratch / "transformers.onnx", scratch / "transformers-optimized.onnx"
    write_graph(encoder, plain, "transformers", None, DEFAULT_OPSET)  # as `bertcf-export onnx` writes it
    optimize_transformers(plain, optimized, encoder.bert.config)
    for label, path in (("transformers export", plain), ("transformers export + ORT optimizer", optimized)):
        graphs[f"{label} fp32"] = path
        graphs[f"{label} int8"] = path.with_name(path.stem + "-int8.onnx")
        quantize(path, graphs[f"{label} int8"], **INT8_OPTIONS)
    return graphs


def operator_counts(path: Path, kinds=("Attention", "QAttention", "SkipLayerNormalization", "BiasGelu",
                                       "FastGelu", "Gelu", "EmbedLayerNormalization", "MatMulInteger",
                                       "QuantizeLinear")) -> dict:
    """How many of ONNX Runtime's fused (and int8) operators the graph holds."""
    import onnx

    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    return {k: ops.count(k) for k in kinds if ops.count(k)}
