"""``--onnx``'s engines: what each choice of the export gives, measured in one run beside the
exported checkpoint in torch and a plain export of transformers' BertModel of the same weights.

Each engine has ``encode(sentences, batch_size)`` (tokenisation, length-sorted batches, rows in
input order): minBERT in torch (``SentenceEncoder``), transformers' BertModel in torch, and ONNX
Runtime on these graphs, each written into a scratch copy of the export:

    minBERT fp32          the export's fp32 graph (``backend.bert_graph``: MultiHeadAttention, Gelu,
                          LayerNormalization on [tokens, D])
    ... SkipLayerNorm     the same on [batch, sequence, D], which ONNX Runtime fuses into
                          SkipLayerNormalization (the graph's alternative, kept to measure it)
    minBERT plain         standard operators only (``--attention plain``)
    minBERT int8          the export's int8 graph (``INT8``: ONNX Runtime's dynamic quantisation,
                          the Q/K/V projections left in float), then MatMulNBits in blocks of 32
                          (the export's until issue 69) and 128, and dynamic quantisation of every
                          projection (per tensor, per channel, reduce_range)
    ... int8 static       static quantisation (QDQ: each MatMul's activations in a uint8 range fixed
                          once on calibration sentences, STS-B train's, not the test set timed)
    transformers export   the TorchScript export of transformers' BertModel with the same pooling
                          (and Normalize), as a user would write it (``--graph transformers``), its
                          dynamic int8 form, and ONNX Runtime's transformer optimizer on it
    --onnx-graph NAME=FILE  any other graph with the export's inputs and outputs (an earlier
                          release's export, to compare with)
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..backend.onnx_export import INT8
from ..backend.transformers_graph import expressible

DYNAMIC = {"method": "dynamic"}
BLOCKWISE = {"method": "blockwise", "block_size": 32}
#: name -> (write_graph's keywords, quantize's keywords or None for the float graph)
MINBERT_VARIANTS = {
    "minBERT fp32": ({}, None),  # the export's fp32 graph
    "minBERT fp32 SkipLayerNorm": ({"flat": False}, None),
    "minBERT plain fp32": ({"attention": "plain"}, None),
    "minBERT int8": ({}, INT8),  # the export's int8 graph
    "minBERT int8 SkipLayerNorm": ({"flat": False}, INT8),
    "minBERT int8 blockwise": ({}, BLOCKWISE),  # the export's until issue 69: independent of the batch
    "minBERT int8 blocks of 128": ({}, BLOCKWISE | {"block_size": 128}),
    "minBERT int8 dynamic": ({}, DYNAMIC),
    "minBERT int8 dynamic per-channel": ({}, DYNAMIC | {"per_channel": True}),
    "minBERT int8 dynamic reduce_range": ({}, DYNAMIC | {"reduce_range": True}),
}
#: name -> (write_graph's keywords, quantize_static_graph's keywords)
STATIC_VARIANTS = {
    "minBERT int8 static per-channel": ({}, {"per_channel": True}),
}
CALIBRATION_SENTENCES = 320  # STS-B train's first, in batches of 32
#: The operator types the table counts in each graph as ONNX Runtime runs it (``runtime_operators``).
OPERATORS = ("MultiHeadAttention", "Attention", "QAttention", "Gelu", "BiasGelu", "FastGelu", "LayerNormalization",
             "SkipLayerNormalization", "EmbedLayerNormalization", "MatMulNBits", "DynamicQuantizeMatMul",
             "MatMulIntegerToFloat", "MatMulInteger", "QLinearMatMul", "MatMul", "FusedMatMul", "Gemm")


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


def build(export_dir: Path, encoder, scratch: Path, calibration: list[str], extra: dict | None = None) -> dict[str, Path]:
    """Every variant graph, written into ``scratch`` (a copy of the export, for its tokenizer and
    settings): name -> its file there. ``calibration``: the static variants' sentences; ``extra``:
    name -> another graph file, copied in."""
    from ..backend.onnx_export import quantize, quantize_static_graph, write_graph

    shutil.copytree(export_dir, scratch, dirs_exist_ok=True)
    graphs, written = {}, {}

    def fp32(options: dict) -> Path:  # each float graph written once, whatever quantises it
        key = tuple(sorted(options.items()))
        if key not in written:
            written[key] = _file(scratch, f"minbert {key}")
            write_graph(encoder, written[key], **options)
        return written[key]

    for name, (options, quantized) in MINBERT_VARIANTS.items():
        if quantized is None:
            graphs[name] = fp32(options)
            continue
        graphs[name] = _file(scratch, name)
        quantize(fp32(options), graphs[name], **quantized)
    batches = calibration_batches(encoder, calibration)
    for name, (options, static) in STATIC_VARIANTS.items():
        graphs[name] = _file(scratch, name)
        quantize_static_graph(fp32(options), graphs[name], batches, **static)
    if expressible(encoder):
        plain, optimized = scratch / "transformers.onnx", scratch / "transformers-optimized.onnx"
        write_graph(encoder, plain, "transformers")  # as `bertcf-export onnx --graph transformers` writes it
        optimize_transformers(plain, optimized, encoder.bert.config)
        for label, path in (("transformers export", plain), ("transformers export + ORT optimizer", optimized)):
            graphs[f"{label} fp32"] = path
            graphs[f"{label} int8"] = path.with_name(path.stem + "-int8.onnx")
            quantize(path, graphs[f"{label} int8"], **DYNAMIC)  # per tensor: what issue 60 measured
    for name, path in (extra or {}).items():
        graphs[name] = _file(scratch, f"extra {name}")
        shutil.copyfile(path, graphs[name])
    return graphs


def operator_counts(path: Path) -> dict:
    """How many of each of ``OPERATORS`` the graph holds once ONNX Runtime has optimised it."""
    from ..backend.onnx_export import runtime_operators

    counts = runtime_operators(path)
    return {k: counts[k] for k in OPERATORS if counts[k]}
