"""Quantised sentence vectors, in numpy alone: int8 and uint8 (a per-dimension range cut into 256
steps) and binary (one bit a dimension, its sign), as sentence-transformers'
``quantize_embeddings`` computes them (Shakir, Aarsen and Lee 2024, "Binary and Scalar Embedding
Quantization"); equal to it on the same vectors (tests/search/test_quantization.py).

    codes = quantize_embeddings(vectors, "int8", calibration_embeddings=calibration)  # [n, D] int8
    bits = quantize_embeddings(vectors, "ubinary")                                    # [n, ceil(D/8)] uint8

- int8, uint8: each dimension's range [min, max] over the calibration vectors (default: the vectors
  themselves; ``ranges`` [2, D] gives it directly) is cut into 255 steps; a value becomes
  floor((x - min) / step), clipped to 0..255 (uint8), less 128 for int8. ``dequantize`` maps the
  codes back to the vectors' coordinates (code × step + min), as sentence-transformers does
  before it rescores.
- binary, ubinary: 1 where the value is above 0, packed eight dimensions a byte (``np.packbits``,
  the last byte padded with zero bits); ubinary is the packed bytes, binary the same bytes less
  128 as int8 (sentence-transformers' two forms). ``unpack_bits`` gives the 0/1 dimensions back.

This module imports numpy only and nothing of BERT-CF: ``SentenceEncoder.encode``, ``bertcf-encode``
and the search indexes use it, and every ONNX export carries a copy of it as
``bertcf_quantization.py`` beside ``bertcf_onnx.py``, whose ``OnnxEncoder`` quantises with it.
"""
from __future__ import annotations

import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
DTYPES = {"float32": np.float32, "int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}


class QuantizationError(ValueError):
    """A precision that does not exist, or int8 ranges that cannot be computed (one line)."""


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise QuantizationError(f"embedding precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    return precision


def is_scalar(precision: str) -> bool:
    """int8 and uint8: the precisions that need ranges."""
    return check_precision(precision).endswith("int8")


def width(dim: int, precision: str) -> int:
    """The columns of a [n, dim] matrix's codes: dim, or ceil(dim / 8) bytes for the binary precisions."""
    return (dim + 7) // 8 if check_precision(precision).endswith("binary") else dim


def ranges_of(embeddings: np.ndarray) -> np.ndarray:
    """Each dimension's [min, max] over the rows of ``embeddings`` [n, D]: [2, D]."""
    embeddings = np.asarray(embeddings)
    return np.vstack((np.min(embeddings, axis=0), np.max(embeddings, axis=0)))


def merge_ranges(ranges: np.ndarray | None, embeddings: np.ndarray) -> np.ndarray:
    """``ranges`` [2, D] widened to the rows of ``embeddings``: the ranges of a matrix read a chunk
    at a time, equal to ``ranges_of`` of the whole (None: the first chunk's)."""
    chunk = ranges_of(embeddings)
    if ranges is None:
        return chunk
    return np.vstack((np.minimum(ranges[0], chunk[0]), np.maximum(ranges[1], chunk[1])))


def _steps(ranges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, steps) of ``ranges`` in float32; a dimension with a range of 0 gets a step of 1."""
    ranges = np.asarray(ranges).astype(np.float32, copy=False)
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    return starts, np.where(steps == 0, 1, steps)


def quantize_embeddings(embeddings, precision: str, ranges: np.ndarray | None = None,
                        calibration_embeddings: np.ndarray | None = None) -> np.ndarray:
    """``embeddings`` [n, D] (or [D]) float vectors in ``precision`` (see the module's docstring):
    float32 [n, D], int8/uint8 [n, D], binary (int8)/ubinary (uint8) [n, ceil(D/8)]. int8's ranges:
    ``ranges`` [2, D] when given, else those of ``calibration_embeddings`` [m, D], else those of
    ``embeddings``."""
    embeddings = np.asarray(embeddings)
    check_precision(precision)
    if embeddings.dtype in (np.int8, np.uint8):
        raise QuantizationError("the vectors to quantise must be float, not int8 or uint8")
    if embeddings.ndim == 2 and embeddings.shape[0] == 0:
        return np.zeros((0, width(embeddings.shape[1], precision)), dtype=DTYPES[precision])
    if precision == "float32":
        return embeddings.astype(np.float32)
    if is_scalar(precision):
        if ranges is None and calibration_embeddings is None and (embeddings.ndim == 1 or len(embeddings) == 1):
            # as sentence-transformers: one vector's range is 0 in every dimension
            raise QuantizationError("int8 ranges cannot be computed from a single vector: give calibration "
                                    "vectors (or ranges) to quantise one")
        if ranges is None:
            ranges = ranges_of(embeddings if calibration_embeddings is None else calibration_embeddings)
        if np.shape(ranges)[-1] != embeddings.shape[-1]:
            raise QuantizationError(f"int8 ranges of {np.shape(ranges)[-1]} dimensions for vectors of "
                                    f"{embeddings.shape[-1]}")
        starts, steps = _steps(ranges)
        codes = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return codes.astype(np.uint8) if precision == "uint8" else (codes - 128).astype(np.int8)
    packed = np.packbits(embeddings > 0, axis=-1)
    return (packed - 128).astype(np.int8) if precision == "binary" else packed


def dequantize(codes: np.ndarray, precision: str, ranges: np.ndarray) -> np.ndarray:
    """int8/uint8 ``codes`` back in the vectors' coordinates, float64: code × step + min (int8's
    codes first raised by 128), sentence-transformers' ``_dequantize_embeddings``."""
    if not is_scalar(precision):
        raise QuantizationError(f"dequantize takes int8 or uint8 codes, not {precision}")
    starts, steps = _steps(ranges)
    values = np.asarray(codes).astype(np.float64)
    if precision == "int8":
        values += 128
    return values * steps + starts


def unpack_bits(codes: np.ndarray, precision: str, dim: int) -> np.ndarray:
    """binary/ubinary ``codes`` [..., ceil(dim/8)] -> their 0/1 dimensions [..., dim] (uint8)."""
    packed = np.asarray(codes)
    if precision == "binary":
        packed = (packed.astype(np.int16) + 128).astype(np.uint8)
    elif precision != "ubinary":
        raise QuantizationError(f"unpack_bits takes binary or ubinary codes, not {precision}")
    return np.unpackbits(packed, axis=-1)[..., :dim]
