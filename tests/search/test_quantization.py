"""Quantised vectors (bertcf.search.quantization) against sentence-transformers' quantize_embeddings
and its dequantisation, on the same float vectors: int8, uint8, binary and ubinary, with ranges
from the vectors, from calibration vectors or given, read whole or a chunk at a time; and
SentenceEncoder.encode(..., embedding_precision=...) against quantize_embeddings of its float vectors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bertcf import SentenceEncoder
from bertcf.errors import UsageError
from bertcf.search import quantization
from bertcf.search.quantization import QuantizationError, quantize_embeddings

st_quantization = pytest.importorskip("sentence_transformers.util.quantization",
                                      reason="sentence-transformers' quantize_embeddings is the reference")

SENTENCES = ["A man is playing a guitar.", "Two dogs run across the park.", "Hello", "",
             "the quick brown fox jumps over the lazy dog", "A woman slices an onion.", "ok ok",
             "Someone plays music on a stage.", "A cat sleeps on the sofa."]


def vectors(n=50, dim=37, seed=0, dtype=np.float32) -> np.ndarray:
    """Float vectors with an odd width (binary's last byte is padded), a constant dimension (a
    range of 0: step 1), exact zeros (binary: not above 0) and values on the ranges' ends."""
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((n, dim)).astype(dtype)
    out[:, 3] = 0.25  # a range of 0
    out[::5, 7] = 0.0  # zeros: not above 0
    return out


@pytest.mark.parametrize("precision", quantization.PRECISIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_precision_equals_sentence_transformers(precision, dtype):
    x = vectors(dtype=dtype)
    calibration = vectors(n=80, seed=1, dtype=dtype) * 0.8  # narrower: clipped codes too
    for kwargs in ({}, {"calibration_embeddings": calibration}, {"ranges": quantization.ranges_of(calibration)}):
        ours = quantize_embeddings(x, precision, **kwargs)
        theirs = st_quantization.quantize_embeddings(x, precision=precision, **kwargs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (precision, kwargs)
        assert np.array_equal(ours, theirs), (precision, kwargs)
    assert quantize_embeddings(x, precision).shape[1] == quantization.width(37, precision)
    empty = quantize_embeddings(np.zeros((0, 37), dtype), precision)
    assert empty.shape == st_quantization.quantize_embeddings(np.zeros((0, 37), dtype), precision=precision).shape


def test_ranges_read_a_chunk_at_a_time_equal_the_whole_and_give_the_same_codes():
    x = vectors(n=103)
    ranges = None
    for start in range(0, len(x), 10):
        ranges = quantization.merge_ranges(ranges, x[start:start + 10])
    assert np.array_equal(ranges, quantization.ranges_of(x))
    chunked = np.concatenate([quantize_embeddings(x[s:s + 10], "int8", ranges) for s in range(0, len(x), 10)])
    assert np.array_equal(chunked, st_quantization.quantize_embeddings(x, precision="int8"))


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_dequantize_equals_sentence_transformers(precision):
    x, ranges = vectors(), quantization.ranges_of(vectors(n=80, seed=1))
    codes = quantize_embeddings(x, precision, ranges)
    ours = quantization.dequantize(codes, precision, ranges)
    theirs = st_quantization._dequantize_embeddings(codes.astype(int), precision, ranges)
    assert ours.dtype == np.float64 and np.array_equal(ours, theirs)
    # within a step of the vectors themselves (inside the ranges)
    step = (ranges[1] - ranges[0]) / 255
    inside = (x >= ranges[0]) & (x <= ranges[1])
    assert np.all((np.abs(ours - x) <= np.where(step == 0, 1, step) + 1e-6)[inside])


@pytest.mark.parametrize("precision", ["binary", "ubinary"])
def test_unpacked_bits_are_the_signs(precision):
    x = vectors()
    bits = quantization.unpack_bits(quantize_embeddings(x, precision), precision, x.shape[1])
    assert bits.shape == x.shape and np.array_equal(bits, (x > 0).astype(np.uint8))


def test_bad_precisions_and_single_vectors_are_refused():
    with pytest.raises(QuantizationError, match="one of float32, int8, uint8, binary, ubinary, not 'int4'"):
        quantize_embeddings(vectors(), "int4")
    with pytest.raises(QuantizationError, match="single vector"):  # sentence-transformers refuses it too
        quantize_embeddings(vectors(n=1), "int8")
    with pytest.raises(ValueError):
        st_quantization.quantize_embeddings(vectors(n=1), precision="int8")
    # with calibration vectors, one vector is fine (as in sentence-transformers)
    one = quantize_embeddings(vectors(n=1), "int8", calibration_embeddings=vectors(seed=2))
    assert np.array_equal(one, st_quantization.quantize_embeddings(vectors(n=1), precision="int8",
                                                                   calibration_embeddings=vectors(seed=2)))
    with pytest.raises(QuantizationError, match="must be float"):
        quantize_embeddings(vectors().astype(np.int8), "binary")
    with pytest.raises(QuantizationError, match="ranges of 5 dimensions for vectors of 37"):
        quantize_embeddings(vectors(), "int8", ranges=np.zeros((2, 5)))


def test_the_module_imports_nothing_of_bertcf():
    """An ONNX export carries a copy of it (bertcf_quantization.py) that runs without BERT-CF."""
    import ast

    tree = ast.parse(open(quantization.__file__, encoding="utf-8").read())
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names} | {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"numpy", "__future__"}


# ---- SentenceEncoder.encode ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def encoder(tiny_bert_dir) -> SentenceEncoder:
    model = SentenceEncoder.from_pretrained(tiny_bert_dir)
    model.normalize = True
    return model.eval()


@pytest.mark.parametrize("precision", quantization.PRECISIONS)
def test_encode_gives_quantize_embeddings_of_its_float_vectors(encoder, precision):
    floats = encoder.encode(SENTENCES).numpy()
    calibration = encoder.encode(SENTENCES[::-1][:4])
    for kwargs in ({}, {"calibration_embeddings": calibration}):
        out = encoder.encode(SENTENCES, embedding_precision=precision, **kwargs)
        theirs = st_quantization.quantize_embeddings(
            floats, precision=precision, **{k: v.numpy() for k, v in kwargs.items()})
        assert isinstance(out, torch.Tensor) and np.array_equal(out.numpy(), theirs), (precision, kwargs)
    # the first k dimensions, then quantised (sentence-transformers' truncate_dim, then precision)
    truncated = encoder.encode(SENTENCES, truncate_dim=17, embedding_precision=precision)
    assert np.array_equal(truncated.numpy(), st_quantization.quantize_embeddings(floats[:, :17], precision=precision))


def test_encode_refuses_bad_precisions_in_one_line(encoder):
    with pytest.raises(UsageError, match="not 'fp8'"):
        encoder.encode(SENTENCES, embedding_precision="fp8")
    with pytest.raises(UsageError, match="single vector"):
        encoder.encode("one sentence", embedding_precision="int8")
    one = encoder.encode("one sentence", embedding_precision="int8", calibration_embeddings=encoder.encode(SENTENCES))
    assert one.shape == (encoder.output_dim,) and one.dtype == torch.int8
    assert encoder.encode([], embedding_precision="ubinary").shape == (0, (encoder.output_dim + 7) // 8)


@pytest.mark.slow
def test_minilm_quantised_vectors_equal_sentence_transformers_encode(real_bert_dir):
    """all-MiniLM-L6-v2: encode(..., embedding_precision=p) against SentenceTransformer.encode(...,
    precision=p). The two models' float vectors agree within 1e-5, not bit for bit, so a value on a
    step's edge may fall one step (or one sign) apart: at most one step, in few dimensions."""
    from sentence_transformers import SentenceTransformer

    ours_model = SentenceEncoder.from_pretrained(real_bert_dir)
    theirs_model = SentenceTransformer(str(real_bert_dir), device="cpu")
    for precision in ("int8", "uint8", "binary", "ubinary"):
        ours = ours_model.encode(SENTENCES, embedding_precision=precision).numpy()
        theirs = theirs_model.encode(SENTENCES, precision=precision)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, precision
        if precision.endswith("binary"):
            differ = (np.unpackbits(ours.view(np.uint8)) != np.unpackbits(theirs.view(np.uint8))).mean()
        else:
            gap = np.abs(ours.astype(int) - theirs.astype(int))
            assert gap.max() <= 1, precision
            differ = (gap > 0).mean()
        assert differ < 0.01, (precision, differ)
