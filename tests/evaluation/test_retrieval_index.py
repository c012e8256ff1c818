"""Retrieval through a search index (RetrievalEvaluator(index=...), ``python -m bertcf.evaluate
--index``): the ranked lists are sentence-transformers' semantic_search_faiss's on the same vectors
(HNSW, binary with and without rescoring), a query never retrieves its own id, the metrics are
those of the exact search's code; the command's table and JSON, and faiss missing."""
from __future__ import annotations

import json
import sys
import zlib

import numpy as np
import pytest
import torch

from bertcf.commands.evaluate import main as cli
from bertcf.data import beir
from bertcf.evaluation.retrieval import RetrievalEvaluator, ranking_metrics

faiss = pytest.importorskip("faiss", reason="the search indexes need faiss-cpu (pip install 'bertcf[search]')")
st_quantization = pytest.importorskip("sentence_transformers.util.quantization",
                                      reason="sentence-transformers' semantic_search_faiss is the reference")

DIM = 48
CUTOFFS = {"ndcg_at": (10,), "mrr_at": (10,), "recall_at": (20,), "map_at": (20,)}


@pytest.fixture(autouse=True)
def one_faiss_thread():
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # the same HNSW graph as sentence-transformers' (built on one thread)
    yield
    faiss.omp_set_num_threads(before)


def embed(texts) -> torch.Tensor:
    """Each text's own random vector (seeded by its bytes), around one of 6 centres by its first
    word: clustered, and no two texts alike."""
    rows = []
    for text in texts:
        centre = np.random.default_rng(zlib.crc32(text.split()[0].encode())).standard_normal(DIM)
        rows.append(centre + 0.8 * np.random.default_rng(zlib.crc32(text.encode())).standard_normal(DIM))
    return torch.tensor(np.array(rows), dtype=torch.float32)


def random_set(seed: int = 0, own_ids: bool = False) -> beir.RetrievalSet:
    rng = np.random.default_rng(seed)
    first = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
    corpus = {f"d{i:03d}": f"{rng.choice(first)} document {i}" for i in range(300)}
    queries = {f"q{i}": f"{rng.choice(first)} query {i}" for i in range(30)}
    if own_ids:  # BEIR's Quora: a query with the id (and the text) of a document
        queries |= {f"d{i:03d}": corpus[f"d{i:03d}"] for i in range(0, 30, 3)}
    qrels = {q: {f"d{int(j):03d}": 1 for j in rng.choice(300, size=3, replace=False)} for q in queries}
    return beir.RetrievalSet(corpus, queries, qrels)


def vectors(evaluator):
    """The evaluator's unit query vectors and corpus vectors (id order), as its search computes them."""
    unit = lambda t: torch.nn.functional.normalize(embed(t), dim=-1).numpy()  # noqa: E731
    return unit(evaluator.queries), unit(evaluator.corpus)


@pytest.mark.parametrize("index, settings, st_kwargs", [
    ("hnsw", {"hnsw_m": 16, "ef_construction": 40, "ef_search": 16}, {"exact": False}),
    ("binary", {"rescore_multiplier": 4}, {"corpus_precision": "ubinary", "rescore_multiplier": 4}),
    ("binary", {"rescore_multiplier": 0}, {"corpus_precision": "ubinary", "rescore": False}),
])
def test_ranked_lists_equal_semantic_search_faiss(index, settings, st_kwargs):
    data = random_set()
    evaluator = RetrievalEvaluator("toy", data, score="cos", index=index, index_settings=settings, corpus_chunk=70,
                                   **CUTOFFS)
    ours = evaluator.search_index(embed)
    queries, corpus = vectors(evaluator)
    if st_kwargs.get("corpus_precision") == "ubinary":
        corpus = st_quantization.quantize_embeddings(corpus, precision="ubinary")
    chunked = index != "hnsw"  # an HNSW graph depends on the chunks it was added in: one chunk there
    if not chunked:
        evaluator.corpus_chunk = len(corpus)
        ours = evaluator.search_index(embed)
    theirs, _ = st_quantization.semantic_search_faiss(queries, corpus_embeddings=corpus, top_k=21, **st_kwargs)
    assert ours == [[h["corpus_id"] for h in row][:20] for row in theirs]
    result = evaluator(embed)
    ranked = [[evaluator.corpus_ids[i] for i in row] for row in ours]
    assert {k: result[k] for k in ("ndcg@10", "recall@20")} == {
        k: v for k, v in ranking_metrics(ranked, evaluator.qrels, **CUTOFFS).items() if k in ("ndcg@10", "recall@20")}
    assert result["index"] == index and result["rescore_multiplier"] == (settings.get("rescore_multiplier") or None)


@pytest.mark.parametrize("index", ["hnsw", "int8", "binary"])
def test_a_query_never_retrieves_its_own_id_from_an_index(index):
    data = random_set(own_ids=True)
    evaluator = RetrievalEvaluator("toy", data, score="cos", index=index, **CUTOFFS)
    for query, row in zip(evaluator.query_ids, evaluator.search_index(embed)):
        assert len(row) == 20 and query not in [evaluator.corpus_ids[i] for i in row]
    kept = RetrievalEvaluator("toy", data, score="cos", index=index, ignore_identical_ids=False, **CUTOFFS)
    # kept, a query that is a document's copy finds it first
    assert all(kept.corpus_ids[row[0]] == q for q, row in zip(kept.query_ids, kept.search_index(embed))
               if q.startswith("d"))


def test_the_command_scores_through_an_index(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    data = random_set()
    beir.write(tmp_path / "set", data.corpus, data.queries, data.qrels)
    argv = ["--encoder", str(tiny_bert_dir), "--tasks", "retrieval", "--retrieval-dir", str(tmp_path / "set"),
            "--no-progress", "--threads", "1"]
    assert cli(argv + ["--index", "binary", "--rescore-multiplier", "3", "--json", str(tmp_path / "b.json")]) == 0
    assert "binary, rescored 3k" in capsys.readouterr().out
    result = json.loads((tmp_path / "b.json").read_text())["retrieval"]
    assert result["index"] == "binary" and result["rescore_multiplier"] == 3 and 0 <= result["ndcg@10"] <= 1
    assert cli(argv + ["--index", "int8", "--no-rescore"]) == 0
    assert "int8, not rescored" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "faiss", None)
    assert cli(argv + ["--index", "hnsw"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'bertcf[search]'" in err and "Traceback" not in err
    assert cli(argv) == 0  # exact search needs no faiss
