"""Sentence vectors from an ONNX export of a BERT-CF encoder, without PyTorch.

    from bertcf.backend.onnx_runtime import OnnxEncoder   # or, beside an export: from bertcf_onnx import OnnxEncoder
    encoder = OnnxEncoder("runs/<run>/best/onnx")  # a directory written by `bertcf-export onnx`
    vectors = encoder.encode(["A man plays a guitar.", "Someone plays music."])  # np.ndarray [2, D], float32

This file imports onnxruntime, numpy and tokenizers only (and tqdm, when a progress bar is asked
for and stderr is a terminal), and of BERT-CF only the numpy module of quantised vectors, ``bertcf/search/quantization.py``:
every export carries a copy of this file as ``bertcf_onnx.py`` and one of that module as
``bertcf_quantization.py`` beside it, so the export directory serves where neither PyTorch nor
BERT-CF is installed (``pip install onnxruntime tokenizers numpy``).

``encode`` has the signature of ``bertcf.SentenceEncoder.encode`` and returns its vectors (within
1e-4 in fp32: tests/backend/test_onnx.py), as a float32 numpy array where that returns a torch tensor.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

if __package__:  # bertcf.backend.onnx_runtime
    from ..search.quantization import QuantizationError, quantize_embeddings
else:  # bertcf_onnx.py in an export, beside bertcf_quantization.py, its copy of bertcf/search/quantization.py
    from bertcf_quantization import QuantizationError, quantize_embeddings

CONFIG_FILE = "onnx_encoder.json"  # written by bertcf/backend/onnx_export.py
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "bertcf-onnx-encoder"


class OnnxModelError(ValueError):
    """A directory that holds no usable ONNX export (one line saying what is missing)."""


def find_export(path) -> Path:
    """The export directory: ``path`` itself, or its ``onnx/`` folder (a checkpoint exported in place)."""
    path = Path(path)
    for candidate in (path, path / "onnx"):
        if (candidate / CONFIG_FILE).is_file():
            return candidate
    if not path.is_dir():
        raise OnnxModelError(f"{path} is not a directory (give the folder `bertcf-export onnx` wrote)")
    raise OnnxModelError(f"{path} holds no {CONFIG_FILE}: not an ONNX export; make one with "
                         f"`bertcf-export onnx CHECKPOINT`")


def read_config(directory: Path) -> dict:
    try:
        config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise OnnxModelError(f"{directory / CONFIG_FILE} is not a readable JSON file ({type(e).__name__})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise OnnxModelError(f"{directory / CONFIG_FILE} is not the description of a BERT-CF ONNX export")
    return config


class OnnxEncoder:
    """An exported encoder under ONNX Runtime. ``quantized``: the int8 graph (an export made with
    ``--quantize int8``); ``threads``: ONNX Runtime's intra-op threads (default: its own choice,
    one per physical core); ``providers``: its execution providers (default: those installed,
    best first, e.g. CUDA before the CPU with onnxruntime-gpu); ``graph``: another graph file of the
    export to run, with the same inputs and outputs (the bench's variants); ``session_options``: ONNX
    Runtime's ``SessionOptions`` to start from (the bench's profiler)."""

    def __init__(self, path, quantized: bool = False, threads: int | None = None, providers=None,
                 graph: str | None = None, session_options=None):
        self.path = find_export(path)
        self.config = read_config(self.path)
        graphs = self.config.get("graphs", {})
        kind = "int8" if quantized else "fp32"
        if graph is None and kind not in graphs:
            raise OnnxModelError(f"{self.path} has no {kind} graph (export with --quantize int8 for one)")
        graph = graph or graphs[kind]
        for name in (graph, TOKENIZER_FILE):
            if not (self.path / name).is_file():
                raise OnnxModelError(f"{self.path / name} is missing: export the checkpoint again")
        options = session_options or ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(self.path / graph), options,
                                                providers=providers or ort.get_available_providers())
            self.tokenizer = Tokenizer.from_file(str(self.path / TOKENIZER_FILE))
        except Exception as e:  # onnxruntime's and tokenizers' own error types
            raise OnnxModelError(f"cannot load the export in {self.path} ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:160]})") from None
        self.tokenizer.no_padding()
        self.dim = int(self.config["dim"])
        self.max_length = int(self.config["max_length"])
        self.normalize = bool(self.config["normalize"])  # the graph ends with Normalize
        self.pad_token_id = int(self.config.get("pad_token_id") or 0)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def _max_length(self, max_length: int | None = None) -> int:
        return min(max_length or self.max_length, int(self.config["max_position_embeddings"]))

    def tokenize(self, sentences, max_length: int | None = None) -> list[list[int]]:
        """Token ids of each sentence, [CLS] ... [SEP], truncated to ``max_length`` tokens."""
        self.tokenizer.enable_truncation(self._max_length(max_length))
        return [e.ids for e in self.tokenizer.encode_batch(list(sentences))]

    def encode(self, sentences, batch_size: int = 64, show_progress_bar: bool = False,
               normalize: bool | None = None, max_length: int | None = None,
               truncate_dim: int | None = None, embedding_precision: str = "float32",
               calibration_embeddings=None) -> np.ndarray:
        """Encode sentences to a float32 array [n, D] (a single string gives [D]), as
        ``SentenceEncoder.encode``: length-sorted batches, rows in input order, unit vectors when
        the model normalises (``normalize`` overrides it); ``truncate_dim``: the first k dimensions
        (a Matryoshka-trained model's smaller widths), cut after the model's own normalisation and
        before the one ``normalize=True`` asks for, as sentence-transformers does;
        ``embedding_precision`` int8, uint8, binary or ubinary: the vectors quantised last, as
        sentence-transformers' ``quantize_embeddings``, int8's ranges those of
        ``calibration_embeddings`` ([m, D] float vectors) or else of the vectors."""
        single = isinstance(sentences, str)
        sentences = [sentences] if single else list(sentences)
        vectors = np.empty((0, self.dim), dtype=np.float32)
        if sentences:
            # the export's own Normalize before the cut; a normalize asked for here after it
            vectors = self.encode_ids(self.tokenize(sentences, max_length), batch_size, show_progress_bar,
                                      self.normalize if normalize is None else False)
        if truncate_dim is not None:
            if not 1 <= truncate_dim <= self.dim:
                raise OnnxModelError(f"truncate_dim {truncate_dim}: the export's vectors have {self.dim} dimensions")
            vectors = vectors[:, :truncate_dim]
        if normalize:
            vectors = l2_normalize(vectors)
        if embedding_precision != "float32":
            try:
                vectors = quantize_embeddings(vectors, embedding_precision, calibration_embeddings=calibration_embeddings)
            except QuantizationError as e:
                raise OnnxModelError(str(e)) from None
        return vectors[0] if single else vectors

    def encode_ids(self, token_ids, batch_size: int = 64, show_progress_bar: bool = False,
                   normalize: bool = False) -> np.ndarray:
        """:meth:`encode` for sentences tokenised already (lists of ids): [n, D] float32, in input
        order; unit vectors when ``normalize``."""
        out = np.empty((len(token_ids), self.dim), dtype=np.float32)
        order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))  # longest first
        starts = range(0, len(order), batch_size)
        if show_progress_bar and sys.stderr.isatty():  # a bar on a terminal only: never redrawn into a log
            from tqdm.auto import tqdm
            starts = tqdm(starts, desc="encode", unit="batch")
        for start in starts:
            rows = order[start:start + batch_size]
            out[rows] = self.run([token_ids[i] for i in rows], normalize)
        return out

    def run(self, id_lists, normalize: bool = False) -> np.ndarray:
        """One batch of token id lists -> [b, D] float32 (padded to its longest sentence)."""
        input_ids, attention_mask = pad_batch(id_lists, self.pad_token_id)
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self.input_names:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        # The graph's last output is the vector before Normalize where it has one.
        output = "sentence_embedding" if normalize == self.normalize or normalize else self.config["outputs"][-1]
        vectors = self.session.run([output], feed)[0]
        if normalize and not self.normalize:
            vectors = l2_normalize(vectors)
        return vectors


def pad_batch(id_lists, pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> input_ids, attention_mask int64 [b, longest]."""
    longest = max(len(ids) for ids in id_lists)
    input_ids = np.full((len(id_lists), longest), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(id_lists), longest), dtype=np.int64)
    for i, ids in enumerate(id_lists):
        input_ids[i, :len(ids)] = ids
        attention_mask[i, :len(ids)] = 1
    return input_ids, attention_mask


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as torch.nn.functional.normalize (norms floored at 1e-12)."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
