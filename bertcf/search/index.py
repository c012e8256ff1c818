"""Approximate-nearest-neighbour indexes over sentence vectors, on faiss (Douze et al. 2024, "The
Faiss library"): ``VectorIndex``, one of four kinds, searched by inner product (cosine on unit vectors).

    exact   float32, every vector scored (faiss ``IndexFlatIP``)
    hnsw    float32 in an HNSW graph (Malkov and Yashunin 2018; ``IndexHNSWFlat``)
    int8    the int8 codes of ``quantization.quantize_embeddings`` in an HNSW graph, one byte a
            dimension (``IndexHNSWSQ``, scalar quantiser ``QT_8bit_direct_signed``: the codes are
            stored as they are and scored as integers against the query's codes)
    binary  one bit a dimension (``ubinary``), every vector compared by Hamming distance
            (``IndexBinaryFlat``: a popcount scan, 32 times smaller than float32)

Rescoring (int8, binary): the query's codes find ``rescore_multiplier`` × k candidates, which are
scored again by the float query against their codes, dequantised (int8) or unpacked to 0/1 (binary),
and the best k kept: sentence-transformers' ``semantic_search_faiss`` (its procedure, tested equal
on the same index). Without rescoring the scores are the codes' inner products (int8) or Hamming
distances (binary, lower first). The int8 codes are signed (centred on each dimension's mid-range)
rather than sentence-transformers' uint8 for faiss: the inner product of uint8 codes adds a term
that grows with the sum of a document's codes, whatever the query.

faiss is an optional extra (``pip install 'bertcf[search]'``): without it, building or reading an
index is one ``UsageError`` saying what to install. Importing this module imports neither faiss
nor torch.
"""
from __future__ import annotations

import numpy as np

from ..errors import DataError, UsageError
from . import quantization

KINDS = ("exact", "hnsw", "int8", "binary")
PRECISION = {"exact": "float32", "hnsw": "float32", "int8": "int8", "binary": "ubinary"}
#: HNSW's graph degree M, the candidate lists of construction and search, and the candidates rescored
#: (× k). sentence-transformers' semantic_search_faiss uses M 16 and faiss's 40 and 16, and rescores 2 k.
HNSW_M, EF_CONSTRUCTION, EF_SEARCH, RESCORE_MULTIPLIER = 32, 200, 128, 4
INSTALL = "pip install 'bertcf[search]' (or pip install faiss-cpu)"
RESCORE_ELEMENTS = 2 ** 25  # the rescored candidates' values held at once ([queries, k x multiplier, D], 8 bytes each)


def import_faiss():
    """faiss, or one line saying how to install it."""
    try:
        import faiss
    except ImportError:
        raise UsageError(f"the search indexes need faiss, which is not installed: {INSTALL}") from None
    return faiss


def set_threads(threads: int | None) -> None:
    """faiss's OpenMP threads (None: its default, every core). An HNSW graph built on several
    threads differs a little from run to run; one thread builds the same graph every time."""
    if threads:
        import_faiss().omp_set_num_threads(threads)


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise UsageError(f"index kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return kind


class VectorIndex:
    """An index of ``kind`` over vectors of ``dim`` dimensions. ``ranges`` [2, dim]: int8's ranges
    (``quantization.ranges_of`` the corpus or calibration vectors); ``hnsw_m``, ``ef_construction``,
    ``ef_search``: the HNSW graph's. ``faiss_index``: one read from a file (``read``). Vectors go in
    (``add``) and queries come in (``search``) as float32 [n, dim]: unit vectors for the cosine."""

    def __init__(self, kind: str, dim: int, ranges: np.ndarray | None = None, hnsw_m: int = HNSW_M,
                 ef_construction: int = EF_CONSTRUCTION, ef_search: int = EF_SEARCH, faiss_index=None):
        faiss = import_faiss()
        self.kind, self.dim, self.precision = check_kind(kind), int(dim), PRECISION[kind]
        if kind == "int8" and (ranges is None or np.shape(ranges) != (2, dim)):
            raise UsageError(f"an int8 index needs the ranges [2, {dim}] of its vectors")
        self.ranges = None if ranges is None else np.asarray(ranges, dtype=np.float32)
        self.faiss = faiss_index if faiss_index is not None else self._new(faiss, hnsw_m, ef_construction)
        if kind in ("hnsw", "int8"):
            self.faiss.hnsw.efSearch = ef_search

    def _new(self, faiss, m: int, ef_construction: int):
        if self.kind == "exact":
            return faiss.IndexFlatIP(self.dim)
        if self.kind == "binary":
            return faiss.IndexBinaryFlat(8 * quantization.width(self.dim, "ubinary"))
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, m, faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexHNSWSQ(self.dim, faiss.ScalarQuantizer.QT_8bit_direct_signed, m,
                                      faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        return index

    def __len__(self) -> int:
        return int(self.faiss.ntotal)

    @property
    def nbytes(self) -> int:
        """The index's size: the bytes faiss writes for it (vectors or codes, and the graph)."""
        faiss = import_faiss()
        serialize = faiss.serialize_index_binary if self.kind == "binary" else faiss.serialize_index
        return int(serialize(self.faiss).size)

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """What faiss stores and searches with for float32 ``vectors`` [n, dim]: the vectors, int8
        codes as float32 values, or packed bits (uint8)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise UsageError(f"vectors of shape {list(vectors.shape)} for an index of {self.dim} dimensions")
        if self.kind == "int8":
            return quantization.quantize_embeddings(vectors, "int8", ranges=self.ranges).astype(np.float32)
        if self.kind == "binary":
            return quantization.quantize_embeddings(vectors, "ubinary")
        return vectors

    def add(self, vectors: np.ndarray) -> None:
        """Add float32 ``vectors`` [n, dim] (their rows get the next ids, 0, 1, ...)."""
        self.faiss.add(self.encode(vectors))

    def search(self, queries: np.ndarray, k: int, rescore_multiplier: int | None = RESCORE_MULTIPLIER
               ) -> tuple[np.ndarray, np.ndarray]:
        """Each query's k nearest: (scores [q, k], ids [q, k] int64), best first; -1 (and a score
        of -inf, or a Hamming distance of the bits + 1) where the index holds fewer than k.
        Scores: inner products (float32 for the float kinds, float64 when rescored), int8 codes'
        inner products, or Hamming distances (binary, not rescored). ``rescore_multiplier`` None
        or 0: no rescoring."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        rescore = bool(rescore_multiplier) and self.kind in ("int8", "binary")
        wanted = k * rescore_multiplier if rescore else k
        scores, ids = self.faiss.search(self.encode(queries), wanted)
        if not rescore:
            missing = 8 * quantization.width(self.dim, "ubinary") + 1 if self.kind == "binary" else -np.inf
            return np.where(ids < 0, missing, scores), ids
        codes = self.stored_codes()
        out_scores, out_ids = np.empty((len(queries), k)), np.empty((len(queries), k), dtype=np.int64)
        block = max(1, RESCORE_ELEMENTS // (wanted * self.dim))
        for start in range(0, len(queries), block):
            rows = slice(start, start + block)
            out_scores[rows], out_ids[rows] = self.rescore(queries[rows], ids[rows], codes, k)
        return out_scores, out_ids

    def rescore(self, queries: np.ndarray, ids: np.ndarray, codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The best k of each query's candidates ``ids`` [q, c] by the float query's inner product
        with their codes, dequantised (int8) or unpacked to 0/1 (binary), as semantic_search_faiss
        rescores; ties keep the candidates' order."""
        found = ids >= 0
        candidates = codes[np.where(found, ids, 0)]
        if self.kind == "binary":
            candidates = quantization.unpack_bits(candidates, "ubinary", self.dim).astype(int)
        else:
            candidates = quantization.dequantize(candidates, "int8", self.ranges)
        scores = np.einsum("ij,ikj->ik", queries, candidates).astype(np.float64, copy=False)
        scores[~found] = -np.inf
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, best, 1), np.take_along_axis(ids, best, 1)

    def stored_codes(self) -> np.ndarray:
        """The codes faiss holds, [n, dim] int8 or [n, bytes] uint8, read in place (no copy)."""
        faiss = import_faiss()
        storage = self.faiss if self.kind == "binary" else faiss.downcast_index(self.faiss.storage)
        array = storage.xb if self.kind == "binary" else storage.codes
        raw = faiss.rev_swig_ptr(array.data(), array.size()).reshape(len(self), storage.code_size)
        # QT_8bit_direct_signed stores code + 128
        return raw if self.kind == "binary" else (raw ^ 0x80).view(np.int8)

    def write(self, path) -> None:
        faiss = import_faiss()
        (faiss.write_index_binary if self.kind == "binary" else faiss.write_index)(self.faiss, str(path))

    @classmethod
    def read(cls, path, kind: str, dim: int, ranges: np.ndarray | None = None,
             ef_search: int = EF_SEARCH) -> "VectorIndex":
        """The index of ``kind`` that ``write`` wrote to ``path``; a file faiss cannot read, or an
        index of another kind or width, is a DataError."""
        faiss = import_faiss()
        try:
            index = (faiss.read_index_binary if kind == "binary" else faiss.read_index)(str(path))
        except RuntimeError as e:
            reason = " ".join(str(e).split()).rpartition(": ")[2][:120]
            raise DataError(f"{path} is not a readable faiss index (corrupt or truncated? {reason}); build the "
                            f"index again") from None
        expected = {"exact": "IndexFlatIP", "hnsw": "IndexHNSWFlat", "int8": "IndexHNSWSQ",
                    "binary": "IndexBinaryFlat"}[kind]
        bits = 8 * quantization.width(dim, "ubinary") if kind == "binary" else dim
        if type(index).__name__ != expected or index.d != bits:
            raise DataError(f"{path} holds a {type(index).__name__} of {index.d} dimensions, not the {kind} index "
                            f"of {dim} its index.json describes; build the index again")
        return cls(kind, dim, ranges=ranges, ef_search=ef_search, faiss_index=index)
