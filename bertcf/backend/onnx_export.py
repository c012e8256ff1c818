"""A checkpoint as ONNX graphs that ONNX Runtime runs without PyTorch (``bertcf-export onnx``).

The export directory (default ``CHECKPOINT/onnx``) holds:

    encoder.onnx         the whole encoder: input_ids, attention_mask [batch, sequence] (int64)
                         -> sentence_embedding [batch, D] (float32): the BERT, the pooling, the flow
                         and the linear head (Dense) when the checkpoint has them, and Normalize when
                         it normalises (then also unnormalized_embedding, the vector before Normalize)
    encoder_qint8.onnx   the same with int8 weights and int8 arithmetic (``--quantize int8``: ONNX
                         Runtime's dynamic quantisation of every weight matrix but the attention's
                         Q, K and V projections, one activation range a batch, so that a sentence's
                         vector varies a little with its batch; ``INT8``, ``quantize``)
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

The graphs are minBERT's padded forward as ``backend.bert_graph`` writes it for ONNX Runtime (each
layer's attention as ``MultiHeadAttention`` on three projection MatMuls, GELU as ``Gelu``,
LayerNormalization on [tokens, D]; ``attention="plain"``: standard operators only, for other
runtimes), the int8 graph that graph quantised (``quantize``, ``INT8``); ``graph="transformers"``
writes transformers' BertModel of the same weights instead (``backend.transformers_graph``).
Every graph gives the same values at the real tokens as the unpadded training path; the export
checks that on a batch (``onnx_encoder.json``: "parity").
"""
from __future__ import annotations

import logging
import shutil
import warnings
from collections import Counter
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UsageError
from ..models.encoder import FIRST_LAST_AVG, SentenceEncoder, pool
from ..runs import resolve_encoder_path
from ..search import quantization
from ..utils.files import save_dir_atomic, write_json_atomic
from . import bert_graph

CONFIG_FILE = "onnx_encoder.json"  # onnx_runtime.py reads it (its own copy of these names)
GRAPH_FILE = "encoder.onnx"
ST_GRAPH_FILE = "model.onnx"  # sentence-transformers' name in a checkpoint's onnx/ folder
QUANTIZED_SUFFIX = {"int8": "_qint8"}
#: The int8 graphs' quantisation (``quantize``): ONNX Runtime's dynamic quantisation (int8 weights, one
#: scale a matrix; each product's activations quantised to uint8 as it runs, with one range for the
#: whole batch) of every weight matrix but each layer's Q, K and V projections, which stay in float.
#: The fastest int8 graph measured within 0.2 STS-B points of fp32 (docs/BENCHMARKS.md, issue 69: on
#: all-MiniLM-L6-v2 2.55x torch, -0.15 on the mean of four batchings; with Q, K and V in int8 too
#: -0.21). Since the range is the batch's, a sentence's int8 vector depends on the batch it is
#: encoded in. ``method="blockwise"`` (MatMulNBits, each token's activations quantised alone) is
#: independent of the batch and kept fp32's score (+0.03), but ran at 1.50x; ``bench --onnx`` times
#: it and the other settings beside this one.
INT8 = {"method": "dynamic", "float_attention_projections": True}
RUNTIME_FILE = "bertcf_onnx.py"  # the copy of onnx_runtime.py
QUANTIZATION_FILE = "bertcf_quantization.py"  # the copy of search/quantization.py, which bertcf_onnx.py imports
DEFAULT_OPSET = 18
ATTENTIONS = ("fused", "plain")  # ONNX Runtime's fused operators or standard ones (``write_graph``)
GRAPHS = ("auto", "transformers", "minbert")  # what the graphs are written from (``resolve_graph``)
#: A sentence of each kind for the export's own parity check (and the traced example batch).
CHECK_SENTENCES = ["A man is playing a guitar.", "Hello", "Two dogs run across the park in the morning sun, "
                   "chasing a red ball that a child threw over the fence."]
PARITY_LIMIT = 1e-3  # fp32 max abs difference above which the export is refused as wrong


class SentenceGraph(nn.Module):
    """What encoder.onnx computes: token ids and mask -> the sentence vector, as
    ``SentenceEncoder.encode`` computes it (pooling, flow, linear head, Normalize), through
    minBERT's padded forward as ``bert_graph`` writes it (``fused``: ONNX Runtime's operators;
    ``flat``: the layers on [tokens, D])."""

    def __init__(self, encoder: SentenceEncoder, fused: bool = True, flat: bool = True):
        super().__init__()
        self.encoder, self.fused, self.flat = encoder, fused, flat

    def forward(self, input_ids, attention_mask):
        encoder = self.encoder
        out = bert_graph.forward(encoder.bert, input_ids, attention_mask, fused=self.fused, flat=self.flat,
                                 first_layer=encoder.pooling == FIRST_LAST_AVG)
        last, first = out if encoder.pooling == FIRST_LAST_AVG else (out, None)
        vector = pool(last, attention_mask, encoder.pooling, first)
        if encoder.flow is not None:
            vector = encoder.flow(vector)[0]
        if encoder.dense is not None:  # the linear head (a whitening map, a projection), last
            vector = encoder.dense(vector)
        if encoder.normalize:
            return F.normalize(vector, dim=-1), vector
        return vector


class TransformerGraph(nn.Module):
    """sentence-transformers' Transformer module: ids, mask, token types -> last_hidden_state."""

    def __init__(self, encoder: SentenceEncoder, fused: bool = True):
        super().__init__()
        self.bert, self.fused = encoder.bert, fused

    def forward(self, input_ids, attention_mask, token_type_ids):
        return bert_graph.forward(self.bert, input_ids, attention_mask, token_type_ids, fused=self.fused)


def output_names(encoder: SentenceEncoder) -> list[str]:
    return ["sentence_embedding"] + (["unnormalized_embedding"] if encoder.normalize else [])


def export_graph(module: nn.Module, inputs: dict, outputs: list[str], path: Path, opset: int,
                 max_positions: int) -> None:
    """torch.onnx's exporter (torch.export + onnxscript) with the batch and sequence axes dynamic,
    ``bert_graph``'s contrib operators translated, every constant subgraph folded (each weight's
    transpose, the position table plus the type-0 embedding, the flow's LU product: onnxscript folds
    only small ones by default, and an unfolded weight is neither precomputed nor quantised), then
    ``onnx.checker``."""
    import onnx
    import onnxscript.optimizer

    batch, sequence = torch.export.Dim("batch", max=2**20), torch.export.Dim("sequence", max=max_positions)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # its notes on optional torchvision ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's notes on axis names and deprecations, not the user's business
        program = torch.onnx.export(module, tuple(inputs.values()), input_names=list(inputs), output_names=outputs,
                                    dynamic_shapes=tuple({0: batch, 1: sequence} for _ in inputs),
                                    opset_version=opset, dynamo=True, external_data=False, verbose=False,
                                    optimize=False, custom_translation_table=bert_graph.TRANSLATION)
    onnxscript.optimizer.optimize(program.model, input_size_limit=2**40, output_size_limit=2**40)
    program.save(str(path), external_data=False)
    onnx.checker.check_model(str(path), full_check=True)


def quantize(source: Path, target: Path, method: str, block_size: int = 32,
             float_attention_projections: bool = False, **options) -> None:
    """The int8 graph of ``source`` at ``target``: every MatMul with a weight quantised (the flow's
    and the linear head's too; the attention's products and the fused operators stay in float) but,
    with ``float_attention_projections``, each layer's Q, K and V (``attention_projections``).
    ``dynamic`` (the export's, ``INT8``): ``quantize_dynamic``, int8 weights and one uint8 range for
    a whole batch's activations, so a sentence's vector depends on its batch (``options``: its
    keywords, e.g. per_channel, reduce_range). ``blockwise``: ONNX Runtime's ``MatMulNBits`` with
    8-bit symmetric weights in blocks of ``block_size`` rows, and int8 arithmetic
    (``accuracy_level=4``: each row of the activations quantised per block, so a sentence's vector
    does not depend on its batch)."""
    import onnx
    from onnxruntime.quantization.onnx_model import ONNXModel

    model = _clean_value_info(onnx.load(str(source)))
    # F.linear on a matrix (the layers' output and feed-forward projections on [tokens, D], the
    # flow's, the head's) exports as Gemm, which both quantisers take only as a MatMul (and an Add);
    # quantize_dynamic would make the change itself, under new node names: made here, the names left
    # out below are those the quantiser sees
    ONNXModel(model).replace_gemm_with_matmul()
    excluded = attention_projections(model) if float_attention_projections else []
    logging.disable(logging.WARNING)  # the quantisers' progress notes and advice to pre-process
    try:
        if method == "blockwise":
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

            quantizer = MatMulNBitsQuantizer(model, bits=8, block_size=block_size, is_symmetric=True,
                                             accuracy_level=4, nodes_to_exclude=excluded, **options)
            quantizer.process()
            quantizer.model.save_model_to_file(str(target))
        elif method == "dynamic":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # the contrib operators' outputs have no type for shape inference: they are float
            quantize_dynamic(model, str(target), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                             nodes_to_exclude=excluded, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                             **options)
        else:
            raise ValueError(f"quantisation method {method!r}: blockwise or dynamic")
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


def attention_projections(model) -> list[str]:
    """The names of the weight MatMuls of the graph (an ``onnx.ModelProto`` whose Gemms are MatMuls)
    that share their input with two or more others: each layer's Q, K and V projections, which all
    read the layer's hidden states, in every graph the export writes (minBERT's, fused or plain,
    model.onnx, transformers' BertModel). Every other weight matrix (the attention's output and the
    feed-forward projections, the flow's, the linear head's) reads a tensor of its own."""
    weights = {i.name for i in model.graph.initializer}
    readers = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            readers.setdefault(node.input[0], []).append(node.name)
    return [name for names in readers.values() if len(names) >= 3 for name in names]


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
    computed tensors (the attention scores of a plain graph) stay in float; the fused
    ``MultiHeadAttention`` always does."""
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


def runtime_operators(path: Path) -> Counter:
    """The operator types of the graph ONNX Runtime runs for the file ``path``, counted: the graph
    after the optimisations a default CPU session applies (its fusions: MultiHeadAttention stays,
    Add + Gelu becomes BiasGelu, MatMul + Add Gemm, 3-D Add + LayerNormalization
    SkipLayerNormalization, int8 MatMuls DynamicQuantizeMatMul, ...)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="bertcf-ort-") as scratch:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(scratch) / "optimized.onnx")
        options.log_severity_level = 3  # not its warning that the saved graph is for this CPU only: it is only counted
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)


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


def write_graph(encoder: SentenceEncoder, path: Path, graph: str = "minbert", attention: str = "fused",
                opset: int = DEFAULT_OPSET, flat: bool = True) -> None:
    """encoder.onnx's graph at ``path``: from minBERT (``bert_graph``: ``attention`` fused, ONNX
    Runtime's operators, or plain, standard ones; ``flat``: the layers on [tokens, D]) or from
    transformers' BertModel of the same weights (``transformers_graph``)."""
    import onnx

    from .transformers_graph import TransformersEncoder, export_transformers

    if graph == "transformers":
        export_transformers(TransformersEncoder(encoder), path, output_names(encoder), opset)
        onnx.checker.check_model(str(path), full_check=True)
    else:
        export_graph(SentenceGraph(encoder, attention == "fused", flat).eval(), example_inputs(encoder),
                     output_names(encoder), path, opset, encoder.bert.config.max_position_embeddings)


def write_export(encoder: SentenceEncoder, directory: Path, quantize_to: str | None, opset: int,
                 sentence_transformers: bool, source: str, graph: str, attention: str | None) -> dict:
    """Write the export into ``directory`` (a fresh one); returns onnx_encoder.json's content.
    ``graph``, ``attention``: what the graphs are written from (``resolve_graph``); the int8 graph
    is the fp32 graph quantised."""
    config = encoder.bert.config
    inputs = example_inputs(encoder)
    write_graph(encoder, directory / GRAPH_FILE, graph, attention, opset)
    graphs = {"fp32": GRAPH_FILE}
    if sentence_transformers:  # minBERT's, whatever encoder.onnx came from
        st_inputs = inputs | {"token_type_ids": torch.zeros_like(inputs["input_ids"])}
        export_graph(TransformerGraph(encoder, attention != "plain").eval(), st_inputs, ["last_hidden_state"],
                     directory / ST_GRAPH_FILE, opset, config.max_position_embeddings)
    if quantize_to:
        suffix = QUANTIZED_SUFFIX[quantize_to]
        graphs[quantize_to] = GRAPH_FILE.replace(".onnx", f"{suffix}.onnx")
        quantize(directory / GRAPH_FILE, directory / graphs[quantize_to], **INT8)
        if sentence_transformers:
            quantize(directory / ST_GRAPH_FILE, directory / ST_GRAPH_FILE.replace(".onnx", f"{suffix}.onnx"),
                     **INT8)
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
            "graph_sources": dict.fromkeys(graphs, {"graph": graph, "attention": attention}),
            "sentence_transformers": ST_GRAPH_FILE if sentence_transformers else None,
            "parity": {name: {"max_abs_diff": diff, "sentences": len(CHECK_SENTENCES)} for name, diff in checked.items()}}
    write_json_atomic(directory / CONFIG_FILE, meta)
    return meta


def resolve_graph(encoder: SentenceEncoder, graph: str, attention: str | None) -> tuple[str, str | None]:
    """What the graphs are written from: (graph, attention). ``minbert`` (``attention``: fused, the
    default, or plain) or ``transformers``; ``auto``: minBERT's fused graph, the fastest measured
    in fp32 and int8 (docs/BENCHMARKS.md, issue 69), and the one graph that expresses every encoder
    (a flow, first-last-avg pooling)."""
    from .transformers_graph import expressible

    if graph == "transformers" and attention is not None:
        raise UsageError("--attention is how minBERT's graph writes a layer's attention: give --graph minbert with it")
    if graph == "transformers" and not expressible(encoder):
        raise UsageError(f"--graph transformers: transformers' BertModel cannot express this encoder (pooling "
                         f"{encoder.pooling}{', a flow' if encoder.flow is not None else ''}); use --graph minbert")
    return ("transformers", None) if graph == "transformers" else ("minbert", attention or "fused")


def export_onnx(source, out=None, quantize_to: str | None = None, opset: int = DEFAULT_OPSET,
                attention: str | None = None, graph: str = "auto") -> tuple[Path, dict]:
    """Export the checkpoint (or run directory: its best/) ``source`` into ``out`` (default
    ``CHECKPOINT/onnx``, where sentence-transformers finds model.onnx); returns (the directory,
    its onnx_encoder.json). The directory is written whole and swapped into place, so an
    interrupted export leaves the previous one; a non-empty ``out`` that is no export is refused."""
    path = Path(resolve_encoder_path(source))
    encoder = SentenceEncoder.from_pretrained(path).eval()
    if encoder.adapters is not None:
        raise UsageError(f"{path} holds Houlsby adapters (--peft houlsby), which do not merge into the weights, and "
                         f"the export writes the plain encoder's graph: encode with the torch backend "
                         f"(python -m bertcf.encode --backend torch)")
    default_out = path / "onnx"
    out = Path(out) if out is not None else default_out
    if out.is_file() or (out.is_dir() and any(out.iterdir()) and not (out / CONFIG_FILE).is_file()):
        raise UsageError(f"--out {out} exists and is not an ONNX export of BERT-CF; give a new or empty directory")
    graph, attention = resolve_graph(encoder, graph, attention)
    sentence_transformers = out.resolve() == default_out.resolve()
    meta = {}

    def write(tmp: Path) -> None:
        # the checkpoint the export came from, for ``python -m bertcf.bench --onnx`` (absolute: it runs anywhere)
        origin = str(path.resolve()) if path.exists() else str(source)
        meta.update(write_export(encoder, tmp, quantize_to, opset, sentence_transformers, origin, graph, attention))
    save_dir_atomic(out, write)
    return out, meta
