"""The search indexes (bertcf.search.index, bertcf.search.store) against faiss's own indexes on the
same vectors, sentence-transformers' semantic_search_faiss (exact, HNSW and binary search, its
rescoring), numpy's brute force, and bertcf's exact retrieval (bertcf.evaluation.retrieval); an
index written and read back, a corrupt one, and faiss missing."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from bertcf.data.beir import RetrievalSet
from bertcf.errors import DataError, UsageError
from bertcf.evaluation.retrieval import RetrievalEvaluator
from bertcf.search import quantization
from bertcf.search.index import VectorIndex, import_faiss
from bertcf.search.store import build_index, unit

faiss = pytest.importorskip("faiss", reason="the search indexes need faiss-cpu (pip install 'bertcf[search]')")
st_quantization = pytest.importorskip("sentence_transformers.util.quantization",
                                      reason="sentence-transformers' semantic_search_faiss is a reference")

DIM, K = 60, 7  # 60 bits: a padded last byte; no two documents share their bits (no ties to rescore)
#: sentence-transformers' HNSW: M 16 and faiss's efConstruction 40 and efSearch 16.
ST_HNSW = {"hnsw_m": 16, "ef_construction": 40, "ef_search": 16}


@pytest.fixture(autouse=True)
def one_faiss_thread():
    """One thread: faiss builds the same HNSW graph every time."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


def clustered(n: int, seed: int) -> np.ndarray:
    """Unit vectors around 12 centres (neighbours a graph search can find), float32 [n, DIM]."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((12, DIM))
    return unit(centres[rng.integers(0, 12, n)] + 0.6 * rng.standard_normal((n, DIM)))


CORPUS, QUERIES = clustered(600, 0), clustered(40, 1)


def hits(results) -> tuple[np.ndarray, np.ndarray]:
    """semantic_search_faiss's [[{"corpus_id", "score"}, ...], ...] as (scores, ids) arrays."""
    return (np.array([[h["score"] for h in row] for row in results]),
            np.array([[h["corpus_id"] for h in row] for row in results]))


def test_exact_search_equals_bertcfs_exact_retrieval_and_sentence_transformers():
    index = build_index(CORPUS, "exact", normalize=False, chunk=128)
    scores, ids = index.search(QUERIES, K)
    # bertcf's exact retrieval (torch, chunked, ties by id) on the same vectors
    data = RetrievalSet({f"d{i:04d}": f"d{i:04d}" for i in range(len(CORPUS))},
                        {f"q{i}": f"q{i}" for i in range(len(QUERIES))}, {f"q{i}": {"d0000": 1} for i in range(len(QUERIES))})
    table = {f"d{i:04d}": v for i, v in enumerate(CORPUS)} | {f"q{i}": v for i, v in enumerate(QUERIES)}
    evaluator = RetrievalEvaluator("toy", data, score="dot", ndcg_at=(K,), mrr_at=(K,), recall_at=(K,), map_at=(K,),
                                   corpus_chunk=100, query_block=16)
    top = evaluator.search(lambda texts: torch.from_numpy(np.stack([table[t] for t in texts])))
    assert np.array_equal(ids, top.indices.numpy())
    np.testing.assert_allclose(scores, top.values.numpy(), atol=1e-5)
    theirs, _ = st_quantization.semantic_search_faiss(QUERIES, corpus_embeddings=CORPUS, top_k=K, exact=True)
    st_scores, st_ids = hits(theirs)
    assert np.array_equal(ids, st_ids) and np.allclose(scores, st_scores, atol=1e-6)


def test_hnsw_equals_sentence_transformers_and_faiss_built_alike():
    ours = build_index(CORPUS, "hnsw", normalize=False, chunk=len(CORPUS), **ST_HNSW)
    theirs, _ = st_quantization.semantic_search_faiss(QUERIES, corpus_embeddings=CORPUS, top_k=K, exact=False)
    scores, ids = ours.search(QUERIES, K)
    st_scores, st_ids = hits(theirs)
    assert np.array_equal(ids, st_ids) and np.allclose(scores, st_scores, atol=1e-6)
    # added a chunk at a time: faiss's own index given the same chunks
    chunked = build_index(CORPUS, "hnsw", normalize=False, chunk=128, hnsw_m=8, ef_construction=20, ef_search=10)
    by_hand = faiss.IndexHNSWFlat(DIM, 8, faiss.METRIC_INNER_PRODUCT)
    by_hand.hnsw.efConstruction, by_hand.hnsw.efSearch = 20, 10
    for start in range(0, len(CORPUS), 128):
        by_hand.add(CORPUS[start:start + 128])
    expected_scores, expected_ids = by_hand.search(QUERIES, K)
    scores, ids = chunked.search(QUERIES, K)
    assert np.array_equal(ids, expected_ids) and np.array_equal(scores, expected_scores)
    exact = build_index(CORPUS, "exact", normalize=False).search(QUERIES, K)[1]
    assert np.mean([len(set(a) & set(b)) / K for a, b in zip(ids.tolist(), exact.tolist())]) > 0.5


def test_int8_holds_quantize_embeddings_codes_and_searches_them_as_faiss_and_numpy_do():
    ranges = quantization.ranges_of(CORPUS)
    index = build_index(CORPUS, "int8", normalize=False, chunk=100, hnsw_m=8, ef_construction=40, ef_search=600)
    codes = st_quantization.quantize_embeddings(CORPUS, precision="int8", ranges=ranges)
    assert np.array_equal(index.ranges, ranges)
    assert np.array_equal(index.stored_codes(), codes)
    assert np.array_equal(index.faiss.reconstruct_n(0, len(CORPUS)), codes.astype(np.float32))
    query_codes = st_quantization.quantize_embeddings(QUERIES, precision="int8", ranges=ranges).astype(np.int64)
    # not rescored: the codes' inner products (numpy's, exactly), nearly all of the true top k
    scores, ids = index.search(QUERIES, K, rescore_multiplier=0)
    brute = query_codes @ codes.astype(np.int64).T
    assert np.array_equal(scores, np.take_along_axis(brute, ids, 1).astype(np.float32))
    best = [set(np.argsort(-row, kind="stable")[:K].tolist()) for row in brute]
    assert np.mean([len(b & set(found)) / K for b, found in zip(best, ids.tolist())]) >= 0.9
    by_hand = faiss.IndexHNSWSQ(DIM, faiss.ScalarQuantizer.QT_8bit_direct_signed, 8, faiss.METRIC_INNER_PRODUCT)
    by_hand.hnsw.efConstruction, by_hand.hnsw.efSearch = 40, 600
    for start in range(0, len(CORPUS), 100):
        by_hand.add(codes[start:start + 100].astype(np.float32))
    assert np.array_equal(by_hand.search(query_codes.astype(np.float32), K)[1], ids)


def rescored_by_hand(index, queries, candidates, k, unpack) -> tuple[np.ndarray, np.ndarray]:
    """semantic_search_faiss's rescoring, step by step, on ``candidates`` [q, c] from ``index.faiss``."""
    embeddings = np.array([[index.faiss.reconstruct(int(i)) for i in row] for row in candidates])
    if unpack:
        embeddings = np.unpackbits(embeddings, axis=-1)[..., :queries.shape[-1]]
        embeddings = embeddings.astype(int)
    else:
        embeddings = st_quantization._dequantize_embeddings(embeddings.astype(int), "int8", index.ranges)
    scores = np.einsum("ij,ikj->ik", queries, embeddings).astype(np.float64)
    order = np.argsort(-scores)[:, :k]
    rows = np.arange(len(queries))[:, None]
    return scores[rows, order], candidates[rows, order]


def test_int8_rescoring_is_sentence_transformers_procedure():
    index = build_index(CORPUS, "int8", normalize=False, hnsw_m=8, ef_construction=40, ef_search=64)
    _, candidates = index.search(QUERIES, 4 * K, rescore_multiplier=0)
    expected_scores, expected_ids = rescored_by_hand(index, QUERIES, candidates, K, unpack=False)
    scores, ids = index.search(QUERIES, K, rescore_multiplier=4)
    assert np.array_equal(ids, expected_ids) and np.allclose(scores, expected_scores, rtol=0, atol=1e-9)


@pytest.mark.parametrize("multiplier", [0, 1, 3])
def test_binary_search_equals_semantic_search_faiss(multiplier):
    index = build_index(CORPUS, "binary", normalize=False, chunk=64)
    assert np.array_equal(index.stored_codes(), st_quantization.quantize_embeddings(CORPUS, precision="ubinary"))
    scores, ids = index.search(QUERIES, K, rescore_multiplier=multiplier)
    for corpus_index in (index.faiss, None):  # our index given to it, and the one it builds itself (exact)
        theirs, _ = st_quantization.semantic_search_faiss(
            QUERIES, corpus_index=corpus_index, corpus_precision="ubinary", top_k=K, rescore=multiplier > 0,
            rescore_multiplier=max(multiplier, 1), exact=True,
            corpus_embeddings=None if corpus_index is not None else
            st_quantization.quantize_embeddings(CORPUS, precision="ubinary"))
        st_scores, st_ids = hits(theirs)
        assert np.array_equal(ids, st_ids) and np.allclose(scores, st_scores, rtol=0, atol=1e-9)
    if multiplier:
        _, candidates = index.search(QUERIES, multiplier * K, rescore_multiplier=0)
        assert np.array_equal(ids, rescored_by_hand(index, QUERIES, candidates, K, unpack=True)[1])


@pytest.mark.parametrize("kind", ["exact", "hnsw", "int8", "binary"])
def test_fewer_documents_than_k_pad_with_minus_one(kind):
    index = build_index(CORPUS[:3], kind, normalize=False)
    scores, ids = index.search(QUERIES[:2], 5)
    assert np.array_equal(np.sort(ids[:, :3], axis=1), [[0, 1, 2]] * 2) and (ids[:, 3:] == -1).all()
    assert np.isfinite(scores[:, :3]).all() and not np.isfinite(scores[:, 3:]).any()


@pytest.mark.parametrize("kind", ["exact", "hnsw", "int8", "binary"])
def test_an_index_written_and_read_back_searches_alike(kind, tmp_path):
    index = build_index(CORPUS, kind, normalize=False, hnsw_m=8, ef_construction=20, ef_search=30)
    index.write(tmp_path / "index.faiss")
    again = VectorIndex.read(tmp_path / "index.faiss", kind, DIM, index.ranges, ef_search=30)
    for multiplier in (0, 2):
        first, second = index.search(QUERIES, K, multiplier), again.search(QUERIES, K, multiplier)
        assert np.array_equal(first[1], second[1]) and np.array_equal(first[0], second[0])
    assert again.nbytes == index.nbytes == (tmp_path / "index.faiss").stat().st_size


def test_corrupt_or_mismatched_index_files_are_one_data_error(tmp_path):
    build_index(CORPUS, "hnsw", normalize=False, hnsw_m=8).write(tmp_path / "good.faiss")
    data = (tmp_path / "good.faiss").read_bytes()
    (tmp_path / "truncated.faiss").write_bytes(data[:len(data) // 2])
    (tmp_path / "garbage.faiss").write_bytes(b"not an index at all")
    for name in ("truncated", "garbage"):
        with pytest.raises(DataError, match="is not a readable faiss index") as error:
            VectorIndex.read(tmp_path / f"{name}.faiss", "hnsw", DIM)
        assert "\n" not in str(error.value)
    with pytest.raises(DataError, match="holds a IndexHNSWFlat of 60 dimensions, not the int8 index"):
        VectorIndex.read(tmp_path / "good.faiss", "int8", DIM, np.zeros((2, DIM)))
    with pytest.raises(DataError, match="not the hnsw index of 16"):
        VectorIndex.read(tmp_path / "good.faiss", "hnsw", 16)


def test_without_faiss_one_line_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss raises ImportError
    with pytest.raises(UsageError, match=r"need faiss, which is not installed: pip install 'bertcf\[search\]'"):
        import_faiss()
    with pytest.raises(UsageError, match="not installed"):
        VectorIndex("hnsw", DIM)


@pytest.mark.parametrize("kind", ["int8", "binary"])
def test_rescoring_a_block_of_queries_at_a_time_changes_nothing(kind, monkeypatch):
    from bertcf.search import index as index_module

    index = build_index(CORPUS, kind, normalize=False, hnsw_m=8)
    whole = index.search(QUERIES, K, rescore_multiplier=3)
    monkeypatch.setattr(index_module, "RESCORE_ELEMENTS", 3 * K * DIM * 7)  # 7 queries a block
    blocked = index.search(QUERIES, K, rescore_multiplier=3)
    assert np.array_equal(whole[1], blocked[1]) and np.array_equal(whole[0], blocked[0])
