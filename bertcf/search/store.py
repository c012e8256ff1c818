"""A search index on disk, built from a corpus's vectors a chunk at a time, and read back.

    INDEX_DIR/index.json       what built it: the model and the width of its vectors, the score, the
                               index kind and its precision, HNSW's settings, the documents' count,
                               faiss's version, the model's vectors of three check sentences, and
                               the checksum (sha256) of each file beside it
    INDEX_DIR/index.faiss      the faiss index (``index.VectorIndex``)
    INDEX_DIR/vectors.npy      the corpus's float32 vectors [documents, width], as the model gave them
    INDEX_DIR/ranges.npy       int8 only: each dimension's [min, max] [2, width], the codes' ranges
    INDEX_DIR/documents.jsonl  one {"id", "text"} a line, row i for the index's id i

The corpus is encoded a chunk at a time into ``vectors.npy`` (memory-mapped), then read back a
chunk at a time for int8's ranges and for the index, so memory holds one chunk of vectors and the
index, never the corpus's float vectors (unless the index is float32). With the cosine score the
vectors are scaled to unit length before they are indexed.

The directory is written by ``directory.replace``: held by one build at a time, written whole in
a temporary directory of the build's own and swapped into place, never over anything a build did
not write, recovered after a kill between the swap's two renames; readers check each file they
read against its checksum in index.json (``directory.verify``).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from ..errors import DataError, UsageError
from ..utils.files import write_json_atomic
from . import quantization
from .directory import (CHECKSUM, DOCUMENTS_FILE, FORMAT, INDEX_FILE, META_FILE, RANGES_FILE, VECTORS_FILE, VERSION,
                        file_checksum, recover, replace, verify)
from .index import EF_CONSTRUCTION, EF_SEARCH, HNSW_M, KINDS, VectorIndex

#: Encoded at build time and again by the model a query comes with: the same model gives the same
#: vectors (cosine at least PROBE_COSINE: room for another engine's last bits, such as ONNX Runtime's).
PROBE_SENTENCES = ["A man is playing a guitar.", "The cat sleeps on the warm windowsill.",
                   "How do I learn to program in Python?"]
PROBE_COSINE = 0.99
CHUNK = 65_536  # vectors encoded, or read back and indexed, at a time


def unit(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (norms floored at 1e-12, as torch's normalize), float32."""
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def encode_to_file(encode, texts: list[str], path, chunk: int = CHUNK, progress=None) -> np.ndarray:
    """The vectors of ``texts``, ``encode(list of texts) -> [n, D]`` float32 ``chunk`` texts at a time,
    written into a memory-mapped float32 .npy at ``path`` (returned, opened read-only).
    ``progress(done)``: called after each chunk with the texts encoded so far."""
    vectors = None
    for start in range(0, len(texts), chunk):
        part = np.asarray(encode(texts[start:start + chunk]), dtype=np.float32)
        if vectors is None:
            vectors = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(len(texts), part.shape[1]))
        vectors[start:start + len(part)] = part
        if progress is not None:
            progress(start + len(part))
    if vectors is None:
        raise DataError("no texts to encode: the corpus is empty")
    vectors.flush()
    del vectors
    return np.load(path, mmap_mode="r")


def chunks(vectors: np.ndarray, normalize: bool, chunk: int = CHUNK):
    """(start, the rows start.. of ``vectors``, unit when ``normalize``), a chunk at a time."""
    for start in range(0, len(vectors), chunk):
        part = np.asarray(vectors[start:start + chunk], dtype=np.float32)
        yield start, unit(part) if normalize else part


def vector_ranges(vectors: np.ndarray, normalize: bool, chunk: int = CHUNK) -> np.ndarray:
    """int8's ranges [2, D] of ``vectors`` read a chunk at a time (unit vectors when ``normalize``)."""
    ranges = None
    for _, part in chunks(vectors, normalize, chunk):
        ranges = quantization.merge_ranges(ranges, part)
    return ranges


def build_index(vectors: np.ndarray, kind: str, normalize: bool, ranges: np.ndarray | None = None,
                chunk: int = CHUNK, **hnsw) -> VectorIndex:
    """A ``VectorIndex`` of ``kind`` over ``vectors`` [n, D] (an array or a memory map), added
    ``chunk`` rows at a time. int8's ranges: ``ranges``, else those of the vectors themselves
    (sentence-transformers' default without calibration). ``hnsw``: hnsw_m, ef_construction, ef_search."""
    if kind == "int8" and ranges is None:
        ranges = vector_ranges(vectors, normalize, chunk)
    index = VectorIndex(kind, vectors.shape[1], ranges=ranges if kind == "int8" else None, **hnsw)
    for _, part in chunks(vectors, normalize, chunk):
        index.add(part)
    return index


def write_documents(path: Path, ids: list[str], texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for key, text in zip(ids, texts):
            handle.write(json.dumps({"id": key, "text": text}, ensure_ascii=False) + "\n")


def build(directory, encode, ids: list[str], texts: list[str], kind: str, score: str, model: dict,
          calibration: np.ndarray | None = None, chunk: int = CHUNK, progress=None, **hnsw) -> dict:
    """Encode ``texts`` (``encode(texts) -> [n, D]``) and write the index of ``kind`` into
    ``directory`` (see the module's docstring); returns index.json's content. ``model``: what
    index.json records of the model (its name, its path, ``truncate_dim``); ``calibration``:
    float vectors [m, D] whose ranges int8 takes (default: the corpus's). The directory is held
    for the build (``hold``; the command holds it from before the model loads)."""
    if len(ids) != len(texts) or not texts:
        raise DataError("the corpus is empty" if not texts else "the corpus has more ids than texts")
    normalize = score == "cos"
    meta = {}

    def write(tmp: Path) -> None:
        vectors = encode_to_file(encode, texts, tmp / VECTORS_FILE, chunk, progress)
        ranges = None
        if kind == "int8":
            ranges = vector_ranges(vectors, normalize, chunk) if calibration is None else quantization.ranges_of(
                unit(calibration) if normalize else calibration)
            np.save(tmp / RANGES_FILE, ranges)
        index = build_index(vectors, kind, normalize, ranges, chunk, **hnsw)
        index.write(tmp / INDEX_FILE)
        write_documents(tmp / DOCUMENTS_FILE, ids, texts)
        probe = np.asarray(encode(PROBE_SENTENCES), dtype=np.float32)
        meta.update(describe(index, score, model, probe, calibration is not None, hnsw)
                    | {"index_bytes": (tmp / INDEX_FILE).stat().st_size,  # not index.nbytes: no second copy
                       "checksums": {"algorithm": CHECKSUM,
                                     "files": {p.name: file_checksum(p) for p in sorted(tmp.iterdir())}}})
        write_json_atomic(tmp / META_FILE, meta)  # last: a directory with its index.json is whole

    replace(directory, write)
    return meta


def describe(index: VectorIndex, score: str, model: dict, probe: np.ndarray, calibrated: bool, hnsw: dict) -> dict:
    """index.json's content (see the module's docstring)."""
    import faiss

    graph = {"hnsw_m": HNSW_M, "ef_construction": EF_CONSTRUCTION, "ef_search": EF_SEARCH} | hnsw
    return {"format": FORMAT, "version": VERSION, "model": model, "dim": index.dim, "score": score,
            "kind": index.kind, "precision": index.precision, "documents": len(index),
            "hnsw": graph if index.kind in ("hnsw", "int8") else None,
            "int8_ranges": ("calibration sentences" if calibrated else "the corpus") if index.kind == "int8" else None,
            "faiss": faiss.__version__,
            "probe": {"sentences": PROBE_SENTENCES, "vectors": probe.tolist()}}


def read_meta(directory) -> dict:
    """index.json of ``directory``, checked: one line for a directory that holds no index."""
    directory = Path(directory)
    path = directory / META_FILE
    if not path.is_file():
        raise DataError(f"{directory} holds no {META_FILE}: not a search index (build one with "
                        f"`python -m bertcf.search build`)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not a readable JSON file ({type(e).__name__}); build the index again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("kind") not in KINDS \
            or not isinstance(meta.get("dim"), int) or not isinstance(meta.get("model"), dict) \
            or not _probe_ok(meta.get("probe"), meta["dim"]) or not _checksums_ok(meta.get("checksums", {})):
        raise DataError(f"{path} is not the description of a BERT-CF search index; build the index again")
    return meta


def _checksums_ok(checksums) -> bool:
    """index.json's checksums: a hashlib algorithm and a hex digest per file ({}: an index built before
    they were recorded)."""
    if not isinstance(checksums, dict):
        return False
    files = checksums.get("files")
    return checksums == {} or (checksums.get("algorithm") in hashlib.algorithms_guaranteed and isinstance(files, dict)
                               and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()))


def _probe_ok(probe, dim: int) -> bool:
    """index.json's check vectors: one row of ``dim`` numbers per check sentence."""
    try:
        vectors = np.asarray(probe["vectors"], dtype=np.float32)
    except (TypeError, KeyError, ValueError):
        return False
    return vectors.shape == (len(PROBE_SENTENCES), dim)


def load(directory, ef_search: int | None = None) -> tuple[VectorIndex, dict]:
    """The index in ``directory`` and its index.json; a missing or corrupt file, a file whose bytes
    are not those its build recorded, or an index that is not what index.json says, is one
    DataError line. An index a build was interrupted in replacing is recovered first (``recover``)."""
    directory = Path(directory)
    recover(directory)
    meta = read_meta(directory)
    if "checksums" not in meta:
        print(f"note: {directory} has no checksums of its files (built before index.json recorded them), so they "
              f"are not checked; build it again to have them checked", file=sys.stderr)
    ranges = None
    if meta["kind"] == "int8":
        if (directory / RANGES_FILE).is_file():
            verify(directory, RANGES_FILE, meta)
        try:
            ranges = np.load(directory / RANGES_FILE)
        except (OSError, ValueError) as e:
            raise DataError(f"{directory / RANGES_FILE}: the int8 index's ranges cannot be read "
                            f"({type(e).__name__}); build the index again") from None
    if not (directory / INDEX_FILE).is_file():
        raise DataError(f"{directory / INDEX_FILE} is missing; build the index again")
    verify(directory, INDEX_FILE, meta)  # before faiss reads it: changed bytes can make faiss read nonsense
    hnsw = meta.get("hnsw") or {}
    index = VectorIndex.read(directory / INDEX_FILE, meta["kind"], meta["dim"], ranges,
                             ef_search=ef_search or hnsw.get("ef_search") or EF_SEARCH)
    if len(index) != meta.get("documents"):
        raise DataError(f"{directory / INDEX_FILE} holds {len(index)} vectors, index.json says "
                        f"{meta.get('documents')}; build the index again")
    return index, meta


def read_documents(directory, documents: int | None = None, meta: dict | None = None) -> tuple[list[str], list[str]]:
    """(ids, texts) of the index's documents, row order; ``documents``: how many index.json
    says the index holds (a file with another count is refused); ``meta``: index.json's content,
    whose checksum the file must match (``verify``; hashed as it is read)."""
    path = Path(directory) / DOCUMENTS_FILE
    ids, texts = [], []
    digest = hashlib.new((meta or {}).get("checksums", {}).get("algorithm", CHECKSUM))
    try:
        with open(path, "rb") as handle:
            for line in handle:
                digest.update(line)
                row = json.loads(line)
                ids.append(str(row["id"]))
                texts.append(row["text"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path} cannot be read ({type(e).__name__}); build the index again") from None
    if documents is not None and len(ids) != documents:
        raise DataError(f"{path} holds {len(ids)} documents, index.json says {documents}; build the index again")
    if meta is not None:
        verify(directory, DOCUMENTS_FILE, meta, digest.hexdigest())
    return ids, texts


def check_model(meta: dict, probe: np.ndarray, name: str) -> None:
    """Refuse a query model (``name``) whose vectors are not those the index was built with: its
    width, or its vectors of the check sentences (cosine below PROBE_COSINE)."""
    built = meta["model"].get("name")
    if probe.shape[-1] != meta["dim"]:
        raise UsageError(f"{name} gives vectors of {probe.shape[-1]} dimensions; the index holds {meta['dim']} "
                         f"(built with {built}); query with that model, or build the index again")
    expected = np.asarray(meta["probe"]["vectors"], dtype=np.float32)
    cosines = (unit(probe) * unit(expected)).sum(-1)
    if cosines.min() < PROBE_COSINE:
        raise UsageError(f"{name} is not the model the index was built with ({built}): its vectors of the check "
                         f"sentences differ (cosine {cosines.min():.3f}); query with that model, or build the "
                         f"index again")
