"""A checkpoint as ONNX graphs that ONNX Runtime runs without PyTorch (``bertcf-export onnx``).

The export directory (default ``CHECKPOINT/onnx``) holds:

    encoder.onnx         the whole encoder: input_ids, attention_mask [batch, sequence] (int64)
                         -> sentence_embedding [batch, D] (float32): the BERT, the pooling, the flow
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

Each graph comes from one of two models (``resolve_graph``). ``"transformers"``: transformers'
BertModel with the checkpoint's weights, exported by torch.onnx's TorchScript exporter
(``backend.transformers_graph``), the fastest fp32 graph measured on the CPU and encoder.onnx's
source by default where it expresses the encoder (mean or [CLS] pooling, no flow).
``"minbert"``: minBERT's padded path (``unpad=False``), the int8 graph's source by default, each layer's
attention as ONNX Runtime's fused ``com.microsoft::Attention`` operator (``attention="fused"``:
``backend.fused_attention``; ``QAttention`` once quantised) or as standard operators
(``"plain"``: scaled_dot_product_attention with a boolean key mask, for other runtimes). Every
graph gives the same values at the real tokens as the unpadded training path; the export checks
that on a batch (``onnx_encoder.json``: "parity").
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
GRAPHS = ("auto", "transformers", "minbert")  # what the graphs are written from (``resolve_graph``)
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

    model = _clean_value_info(onnx.load(str(source)))
    logging.disable(logging.WARNING)  # its advice to pre-process, meant for static quantisation
    try:  # the fused operators' outputs have no type for shape inference: they are float
        quantize_dynamic(model, str(target), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}, **options)
    finally:
        logging.disable(logging.NOTSET)


def _clean_value_info(model):
    """Drop the value_info the exporter writes for each initializer (its shape, which the
    initializer has anyway): ONNX Runtime before 1.32 turns a Gemm into a MatMul by transposing its
    weight in place and leaves that value_info stale, so its shape inference refuses the graph
    ("Inferred shape and existing shape differ")."""
    weights = {initializer.name for initializer in model.graph.initializer}
    kept = [info for info in model.graph.value_info if info.name not in weights]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return model


def activation_matmuls(model) -> list[str]:
    """The MatMul nodes of the graph (an ``onnx.ModelProto``) whose two inputs are both computed (no
    weight): the attention's scores and weighted sum in a plain graph."""
    weights = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and not weights & set(n.input)]


class _Batches:
    """onnxruntime.quantization's CalibrationDataReader over a list of input dicts."""

    def __init__(self, batches: list[dict]):
        self.batches = iter(batches)

    def get_next(self):
        return next(self.batches, None)


def quantize_static_graph(source: Path, target: Path, batches: list[dict], per_channel: bool = False,
                          exclude_activation_products: bool = True) -> None:
    """Static int8 quantisation (ONNX Runtime's ``quantize_static``, QDQ format): each MatMul's
    activations get a fixed uint8 range measured once on ``batches`` (input dicts of numpy arrays,
    the calibration sentences: min/max), its weight int8 (per channel with ``per_channel``), no
    reduced range (the VNNI kernels need none). ``exclude_activation_products``: the MatMuls of two
    computed tensors (the attention scores of a plain graph) stay in float; a fused ``Attention``
    operator always does."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    model = _clean_value_info(onnx.load(str(source)))
    exclude = activation_matmuls(model) if exclude_activation_products else []
    logging.disable(logging.WARNING)  # its advice to pre-process the graph (symbolic shapes), which the fused operators refuse
    try:
        quantize_static(model, str(target), _Batches(batches), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["MatMul"], per_channel=per_channel, reduce_range=False,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=exclude,
                        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
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


def write_graph(encoder: SentenceEncoder, path: Path, graph: str, attention: str | None, opset: int) -> None:
    """encoder.onnx's graph at ``path``: from minBERT (its padded path, ``attention`` fused or plain)
    or from transformers' BertModel of the same weights (``transformers_graph``)."""
    import onnx

    from .transformers_graph import TransformersEncoder, export_transformers

    if graph == "transformers":
        export_transformers(TransformersEncoder(encoder), path, output_names(encoder), opset)
        onnx.checker.check_model(str(path), full_check=True)
    else:
        export_graph(SentenceGraph(encoder).eval(), example_inputs(encoder), output_names(encoder), path, opset,
                     encoder.bert.config.max_position_embeddings, attention)


def write_export(encoder: SentenceEncoder, directory: Path, quantize_to: str | None, opset: int,
                 sentence_transformers: bool, source: str, sources: dict) -> dict:
    """Write the export into ``directory`` (a fresh one); returns onnx_encoder.json's content.
    ``sources``: {"fp32" | "int8": (graph, attention)}, what each graph is written from
    (``resolve_graph``)."""
    config = encoder.bert.config
    inputs = example_inputs(encoder)
    write_graph(encoder, directory / GRAPH_FILE, *sources["fp32"], opset)
    graphs = {"fp32": GRAPH_FILE}
    attention = next((a for _, a in sources.values() if a), "fused")  # minBERT's, for model.onnx
    if sentence_transformers:
        st_inputs = inputs | {"token_type_ids": torch.zeros_like(inputs["input_ids"])}
        export_graph(TransformerGraph(encoder).eval(), st_inputs, ["last_hidden_state"], directory / ST_GRAPH_FILE,
                     opset, config.max_position_embeddings, attention)
    if quantize_to:
        suffix = QUANTIZED_SUFFIX[quantize_to]
        graphs[quantize_to] = GRAPH_FILE.replace(".onnx", f"{suffix}.onnx")
        source_graph = directory / GRAPH_FILE
        if sources[quantize_to] != sources["fp32"]:  # quantised from another graph, written aside and removed
            source_graph = directory / f"{quantize_to}-source.onnx"
            write_graph(encoder, source_graph, *sources[quantize_to], opset)
        quantize(source_graph, directory / graphs[quantize_to], **INT8_OPTIONS)
        if source_graph.name != GRAPH_FILE:
            source_graph.unlink()
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
            "normalize": encoder.normalize, "opset": opset, "source": source,
            "graph_sources": {kind: {"graph": g, "attention": a} for kind, (g, a) in sources.items() if kind in graphs},
            "sentence_transformers": ST_GRAPH_FILE if sentence_transformers else None,
            "parity": {name: {"max_abs_diff": diff, "sentences": len(CHECK_SENTENCES)} for name, diff in checked.items()}}
    write_json_atomic(directory / CONFIG_FILE, meta)
    return meta


def resolve_graph(encoder: SentenceEncoder, graph: str, attention: str | None) -> dict:
    """What each graph is written from: {"fp32" | "int8": (graph, attention)}. ``transformers`` or
    ``minbert`` (``attention``: fused, the default, or plain) for both; ``auto``: the fp32 graph
    from transformers where it expresses the encoder (mean or [CLS] pooling, no flow) and no
    ``--attention`` was asked for, the int8 graph from minBERT's fused graph, the attention left
    in float. Each is the fastest measured that keeps its accuracy: transformers' int8 graph is
    faster still but moved STS-B test by up to 0.25 points with the batching (docs/BENCHMARKS.md)."""
    from .transformers_graph import expressible

    if graph == "transformers" and attention is not None:
        raise UsageError("--attention is how minBERT's graph writes a layer's attention: give --graph minbert with it")
    if graph == "transformers" and not expressible(encoder):
        raise UsageError(f"--graph transformers: transformers' BertModel cannot express this encoder (pooling "
                         f"{encoder.pooling}{', a flow' if encoder.flow is not None else ''}); use --graph minbert")
    minbert = ("minbert", attention or "fused")
    if graph == "auto":
        fp32 = ("transformers", None) if expressible(encoder) and attention is None else minbert
        return {"fp32": fp32, "int8": minbert}
    return dict.fromkeys(("fp32", "int8"), ("transformers", None) if graph == "transformers" else minbert)


def export_onnx(source, out=None, quantize_to: str | None = None, opset: int = DEFAULT_OPSET,
                attention: str | None = None, graph: str = "auto") -> tuple[Path, dict]:
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
    sources = resolve_graph(encoder, graph, attention)
    sentence_transformers = out.resolve() == default_out.resolve()
    meta = {}

    def write(tmp: Path) -> None:
        # the checkpoint the export came from, for ``python -m bertcf.bench --onnx`` (absolute: it runs anywhere)
        origin = str(path.resolve()) if path.exists() else str(source)
        meta.update(write_export(encoder, tmp, quantize_to, opset, sentence_transformers, origin, sources))
    save_dir_atomic(out, write)
    return out, meta
