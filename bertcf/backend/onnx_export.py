"""A checkpoint as ONNX graphs that ONNX Runtime runs without PyTorch (``bertcf-export onnx``).

The export directory (default ``CHECKPOINT/onnx``) holds:

    encoder.onnx         the whole encoder: input_ids, attention_mask [batch, sequence] (int64)
                         -> sentence_embedding [batch, D] (float32): minBERT, the pooling, the flow
                         and the linear head (Dense) when the checkpoint has them, and Normalize when
                         it normalises (then also unnormalized_embedding, the vector before Normalize)
    encoder_qint8.onnx   the same with int8 weights (``--quantize int8``: ONNX Runtime's dynamic
                         quantisation, ``quantize_dynamic``)
    model.onnx           only in CHECKPOINT/onnx: the Transformer part alone, input_ids,
                         attention_mask, token_type_ids -> last_hidden_state [batch, sequence, D],
                         the file sentence-transformers' ``backend="onnx"`` loads from a checkpoint's
                         ``onnx/`` folder (it runs the pooling, the flow, Dense and Normalize itself, in torch);
                         model_qint8.onnx beside it with --quantize int8
    onnx_encoder.json    what OnnxEncoder (onnx_runtime.py) needs: the graphs, dimension, max_length,
                         pad id, whether the graph normalises; and the parity measured at export
    tokenizer files      tokenizer.json (read by the ``tokenizers`` library), vocab.txt, ...
    bertcf_onnx.py       a copy of bertcf/backend/onnx_runtime.py: OnnxEncoder, which imports onnxruntime, numpy and
                         tokenizers only, so the folder serves where neither PyTorch nor BERT-CF is installed
    bertcf_quantization.py  a copy of bertcf/search/quantization.py, which bertcf_onnx.py imports (numpy only):
                         OnnxEncoder.encode's int8 and binary vectors

minBERT exports through its padded path (``unpad=False``), each layer's attention as ONNX
Runtime's fused ``com.microsoft::Attention`` operator (``attention="fused"``, the default:
``backend.fused_attention``; ``QAttention`` once quantised) or as standard operators
(``"plain"``: scaled_dot_product_attention with a boolean key mask, for other runtimes). Both give
the same values at the real tokens as the unpadded training path; the export checks that on a
batch (``onnx_encoder.json``: "parity").
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UsageError
from ..models.encoder import FIRST_LAST_AVG, SentenceEncoder, pool
from ..runs import resolve_encoder_path
from ..search import quantization
from ..utils.files import save_dir_atomic, write_json_atomic

CONFIG_FILE = "onnx_encoder.json"  # onnx_runtime.py reads it (its own copy of these names)
GRAPH_FILE = "encoder.onnx"
ST_GRAPH_FILE = "model.onnx"  # sentence-transformers' name in a checkpoint's onnx/ folder
QUANTIZED_SUFFIX = {"int8": "_qint8"}
#: The int8 graphs' quantisation: every MatMul with a weight, but each layer's fused Attention operator
#: (its Q/K/V projection and the scores) stays in float, which keeps the vectors closer to fp32 at
#: most of the speed (the variants side by side: docs/BENCHMARKS.md, `bench --onnx`).
INT8_OPTIONS = {"op_types_to_quantize": ["MatMul"]}
RUNTIME_FILE = "bertcf_onnx.py"  # the copy of onnx_runtime.py
QUANTIZATION_FILE = "bertcf_quantization.py"  # the copy of search/quantization.py, which bertcf_onnx.py imports
DEFAULT_OPSET = 18
ATTENTIONS = ("fused", "plain")  # how a layer's attention is written (``export_graph``)
#: A sentence of each kind for the export's own parity check (and the traced example batch).
CHECK_SENTENCES = ["A man is playing a guitar.", "Hello", "Two dogs run across the park in the morning sun, "
                   "chasing a red ball that a child threw over the fence."]
PARITY_LIMIT = 1e-3  # fp32 max abs difference above which the export is refused as wrong


class SentenceGraph(nn.Module):
    """What encoder.onnx computes: token ids and mask -> the sentence vector, as
    ``SentenceEncoder.encode`` computes it (pooling, flow, linear head, Normalize), through
    minBERT's padded path."""

    def __init__(self, encoder: SentenceEncoder):
        super().__init__()
        self.encoder = encoder

    @property
    def bert(self):
        return self.encoder.bert

    def forward(self, input_ids, attention_mask):
        encoder = self.encoder
        first = {"output_first_layer": True} if encoder.pooling == FIRST_LAST_AVG else {}
        out = encoder.bert(input_ids, attention_mask, unpad=False, **first)
        vector = pool(out["last_hidden_state"], attention_mask, encoder.pooling, out.get("first_layer_hidden_state"))
        if encoder.flow is not None:
            vector = encoder.flow(vector)[0]
        if encoder.dense is not None:  # the linear head (a whitening map, a projection), last
            vector = encoder.dense(vector)
        if encoder.normalize:
            return F.normalize(vector, dim=-1), vector
        return vector


class TransformerGraph(nn.Module):
    """sentence-transformers' Transformer module: ids, mask, token types -> last_hidden_state."""

    def __init__(self, encoder: SentenceEncoder):
        super().__init__()
        self.bert = encoder.bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.bert(input_ids, attention_mask, token_type_ids, unpad=False)["last_hidden_state"]


def output_names(encoder: SentenceEncoder) -> list[str]:
    return ["sentence_embedding"] + (["unnormalized_embedding"] if encoder.normalize else [])


def export_graph(module: nn.Module, inputs: dict, outputs: list[str], path: Path, opset: int,
                 max_positions: int, attention: str = "fused") -> None:
    """torch.onnx's exporter (torch.export + onnxscript) with the batch and sequence axes dynamic,
    every constant subgraph folded (the fused Q/K/V weight of each layer, the flow's LU product:
    onnxscript folds only small ones by default, and an unfolded weight is neither precomputed nor
    quantised), then ``onnx.checker``. ``attention``: fused, each layer's attention as ONNX
    Runtime's ``Attention`` operator (``fused_attention``); plain, as the exporter writes
    ``scaled_dot_product_attention`` in standard operators (any ONNX runtime runs it)."""
    import onnx
    import onnxscript.optimizer

    from .fused_attention import TRANSLATION, fused_attention

    batch, sequence = torch.export.Dim("batch", max=2**20), torch.export.Dim("sequence", max=max_positions)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # its notes on optional torchvision ops
    fused = attention == "fused"
    with warnings.catch_warnings(), fused_attention(module.bert) if fused else contextlib.nullcontext():
        warnings.simplefilter("ignore")  # torch.export's notes on axis names and deprecations, not the user's business
        program = torch.onnx.export(module, tuple(inputs.values()), input_names=list(inputs), output_names=outputs,
                                    dynamic_shapes=tuple({0: batch, 1: sequence} for _ in inputs),
                                    opset_version=opset, dynamo=True, external_data=False, verbose=False,
                                    optimize=False, custom_translation_table=TRANSLATION if fused else None)
    onnxscript.optimizer.optimize(program.model, input_size_limit=2**40, output_size_limit=2**40)
    program.save(str(path), external_data=False)
    onnx.checker.check_model(str(path), full_check=True)


def quantize(source: Path, target: Path, **options) -> None:
    """Dynamic int8 quantisation (ONNX Runtime): int8 weights, activations quantised per batch;
    ``options``: quantize_dynamic's (per_channel, op_types_to_quantize: the bench's variants)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    # The exporter writes a value_info for each initializer (its shape, which the initializer has
    # anyway). ONNX Runtime before 1.32 turns a Gemm into a MatMul by transposing its weight in place
    # and leaves that value_info stale, so its shape inference refuses the graph ("Inferred shape and
    # existing shape differ"): drop them.
    weights = {initializer.name for initializer in model.graph.initializer}
    kept = [info for info in model.graph.value_info if info.name not in weights]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    logging.disable(logging.WARNING)  # its advice to pre-process, meant for static quantisation
    try:  # the fused operators' outputs have no type for shape inference: they are float
        quantize_dynamic(model, str(target), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}, **options)
    finally:
        logging.disable(logging.NOTSET)


def example_inputs(encoder: SentenceEncoder) -> dict:
    """The export's example batch (three sentences of different lengths, padded)."""
    batch = encoder.tokenize(CHECK_SENTENCES)
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def parity(encoder: SentenceEncoder, path: Path, reference: torch.Tensor) -> float:
    """Max abs difference between ONNX Runtime on ``path`` and ``reference``, the encoder's own
    vectors of CHECK_SENTENCES (unpadded path, in torch)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {k: v.numpy() for k, v in example_inputs(encoder).items()}
    out = session.run(["sentence_embedding"], inputs)[0]
    return float((torch.from_numpy(out) - reference).abs().max())


def write_export(encoder: SentenceEncoder, directory: Path, quantize_to: str | None, opset: int,
                 sentence_transformers: bool, source: str, attention: str = "fused") -> dict:
    """Write the export into ``directory`` (a fresh one); returns onnx_encoder.json's content."""
    config = encoder.bert.config
    module = SentenceGraph(encoder).eval()
    inputs = example_inputs(encoder)
    export_graph(module, inputs, output_names(encoder), directory / GRAPH_FILE, opset, config.max_position_embeddings,
                 attention)
    graphs = {"fp32": GRAPH_FILE}
    if sentence_transformers:
        st_inputs = inputs | {"token_type_ids": torch.zeros_like(inputs["input_ids"])}
        export_graph(TransformerGraph(encoder).eval(), st_inputs, ["last_hidden_state"], directory / ST_GRAPH_FILE,
                     opset, config.max_position_embeddings, attention)
    if quantize_to:
        suffix = QUANTIZED_SUFFIX[quantize_to]
        graphs[quantize_to] = GRAPH_FILE.replace(".onnx", f"{suffix}.onnx")
        quantize(directory / GRAPH_FILE, directory / graphs[quantize_to], **INT8_OPTIONS)
        if sentence_transformers:
            quantize(directory / ST_GRAPH_FILE, directory / ST_GRAPH_FILE.replace(".onnx", f"{suffix}.onnx"),
                     **INT8_OPTIONS)
    with torch.inference_mode():
        reference = encoder.encode(CHECK_SENTENCES)
    checked = {name: parity(encoder, directory / file, reference) for name, file in graphs.items()}
    if not checked["fp32"] <= PARITY_LIMIT:
        raise RuntimeError(f"the exported graph differs from the encoder by {checked['fp32']:.2e} (max abs); "
                           f"this is a bug of the exporter")
    encoder.tokenizer.save_pretrained(str(directory))
    shutil.copyfile(Path(__file__).with_name("onnx_runtime.py"), directory / RUNTIME_FILE)
    shutil.copyfile(Path(quantization.__file__), directory / QUANTIZATION_FILE)
    meta = {"format": "bertcf-onnx-encoder", "version": 1, "graphs": graphs,
            "inputs": list(inputs), "outputs": output_names(encoder), "dim": encoder.output_dim,
            "max_length": encoder._max_length(), "max_position_embeddings": config.max_position_embeddings,
            "pad_token_id": encoder.tokenizer.pad_token_id, "pooling": encoder.pooling,
            "flow": encoder.flow is not None, "dense": encoder.dense is not None,
            "normalize": encoder.normalize, "opset": opset, "source": source, "attention": attention,
            "sentence_transformers": ST_GRAPH_FILE if sentence_transformers else None,
            "parity": {name: {"max_abs_diff": diff, "sentences": len(CHECK_SENTENCES)} for name, diff in checked.items()}}
    write_json_atomic(directory / CONFIG_FILE, meta)
    return meta


def export_onnx(source, out=None, quantize_to: str | None = None, opset: int = DEFAULT_OPSET,
                attention: str = "fused") -> tuple[Path, dict]:
    """Export the checkpoint (or run directory: its best/) ``source`` into ``out`` (default
    ``CHECKPOINT/onnx``, where sentence-transformers finds model.onnx); returns (the directory,
    its onnx_encoder.json). The directory is written whole and swapped into place, so an
    interrupted export leaves the previous one; a non-empty ``out`` that is no export is refused."""
    path = Path(resolve_encoder_path(source))
    encoder = SentenceEncoder.from_pretrained(path).eval()
    default_out = path / "onnx"
    out = Path(out) if out is not None else default_out
    if out.is_file() or (out.is_dir() and any(out.iterdir()) and not (out / CONFIG_FILE).is_file()):
        raise UsageError(f"--out {out} exists and is not an ONNX export of BERT-CF; give a new or empty directory")
    sentence_transformers = out.resolve() == default_out.resolve()
    meta = {}

    def write(tmp: Path) -> None:
        # the checkpoint the export came from, for ``python -m bertcf.bench --onnx`` (absolute: it runs anywhere)
        origin = str(path.resolve()) if path.exists() else str(source)
        meta.update(write_export(encoder, tmp, quantize_to, opset, sentence_transformers, origin, attention))
    save_dir_atomic(out, write)
    return out, meta
