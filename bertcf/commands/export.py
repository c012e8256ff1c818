"""``bertcf-export`` (``python -m bertcf.export``): a trained checkpoint in formats other tools run.

    bertcf-export onnx RUN_OR_MODEL_DIR [--out DIR] [--quantize int8] [--opset N] [--graph auto|transformers|minbert]
                       [--attention fused|plain]
"""
from __future__ import annotations

from ..backend.onnx_export import ATTENTIONS, CONFIG_FILE, DEFAULT_OPSET, GRAPHS, QUANTIZED_SUFFIX, export_onnx
from ..cli import ArgumentParser, checked, run_main

#: The opsets tried with torch 2.13's exporter (torch.export + onnxscript): 18 (the tests) and 20.
OPSET = checked(int, lambda v: 18 <= v <= 20, "from 18 to 20")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m bertcf.export", description="Export a trained checkpoint for other tools.")
    commands = parser.add_subparsers(dest="format", required=True, metavar="FORMAT")
    onnx = commands.add_parser(
        "onnx", help="ONNX graphs for ONNX Runtime: the whole encoder (pooling, flow, Normalize) in one graph",
        description="Write the encoder as one ONNX graph (token ids and mask -> the sentence vector: minBERT, "
                    "pooling, the flow and the linear head when there are, Normalize when the model normalises), "
                    "its tokenizer "
                    f"files, {CONFIG_FILE} and bertcf_onnx.py (OnnxEncoder, which needs no PyTorch).",
        formatter_class=parser.formatter_class)
    onnx.error = parser.error
    onnx.add_argument("model", metavar="RUN_OR_MODEL_DIR",
                      help="a checkpoint, a run directory (its best/), or a sentence-transformers BERT directory")
    onnx.add_argument("--out", default=None,
                      help="the export directory (default: MODEL_DIR/onnx, which also gets model.onnx, the "
                           "Transformer part that sentence-transformers' backend='onnx' loads)")
    onnx.add_argument("--quantize", choices=tuple(QUANTIZED_SUFFIX), default=None,
                      help="also write the graphs with int8 weights and int8 arithmetic (ONNX Runtime's dynamic "
                           "quantisation; each layer's Q, K and V projections stay in float)")
    onnx.add_argument("--opset", type=OPSET, default=DEFAULT_OPSET, help="the ONNX opset of the graphs")
    onnx.add_argument("--graph", choices=GRAPHS, default="auto",
                      help="what the graphs are written from: minbert (minBERT's own padded forward, written for "
                           "ONNX Runtime's fused operators) or transformers (transformers' BertModel with the "
                           "checkpoint's weights, standard operators); auto (default): minbert "
                           "(docs/serving.md says why)")
    onnx.add_argument("--attention", choices=ATTENTIONS, default=None,
                      help="minBERT's graph: fused (default), each layer's attention and GELU as ONNX Runtime's "
                           "MultiHeadAttention and Gelu operators; plain: standard ONNX operators only")
    return parser


def run(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    out, meta = export_onnx(args.model, args.out, args.quantize, args.opset, args.attention, args.graph)
    parity = ", ".join(f"{name} {check['max_abs_diff']:.1e}" for name, check in meta["parity"].items())
    parts = ["pooling " + meta["pooling"]] + ["flow"] * meta["flow"] + ["dense"] * meta["dense"] + \
        ["Normalize"] * meta["normalize"]
    sources = ", ".join(f"{meta['graphs'][kind]} from " + ("transformers' BertModel" if s["graph"] == "transformers"
                                                           else f"minBERT ({s['attention']} attention)")
                        for kind, s in meta["graph_sources"].items())
    print(f"{out}: {sources} ({', '.join(parts)}; opset {meta['opset']}); "
          f"max |ONNX - torch| over {next(iter(meta['parity'].values()))['sentences']} sentences: {parity}")
    if meta["sentence_transformers"]:
        print(f"{out / meta['sentence_transformers']}: the Transformer part, for sentence-transformers' "
              f"backend='onnx'")
    return meta


def main(argv=None) -> int:
    return run_main(run, argv)
