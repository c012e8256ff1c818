"""``python -m bertcf.bench --search``: each index's build time, size, queries per second and
recall@k against exact search, on random unit vectors or a .npy's; the exact row is numpy's brute
force, the sizes are the indexes' bytes, and bad input is one line."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from bertcf.bench.search import random_unit, recall_at_k, true_neighbours
from bertcf.cli import run_main
from bertcf.commands import bench

faiss = pytest.importorskip("faiss", reason="the search indexes need faiss-cpu (pip install 'bertcf[search]')")


#: The machine running the tests may be busy, and the load check has tests of its own (test_load.py).
QUIET = ["--allow-busy", "--load-check", "0"]


def run(*argv) -> int:
    return run_main(bench.run, [*map(str, argv), *QUIET])


def test_each_index_on_random_unit_vectors(tmp_path, capsys):
    assert run("--search", "random", "--search-n", 600, "--search-dim", 40, "--search-queries", 25, "--search-k", 5,
               "--search-rounds", 1, "--threads", 1, "--seed", 3, "--hnsw-m", 8, "--ef-construction", 40,
               "--search-indexes", "exact,hnsw,int8,int8-no-rescore,binary,binary-no-rescore",
               "--json", tmp_path / "out.json") == 0
    out = json.loads((tmp_path / "out.json").read_text())
    results = out["results"]["search"]
    assert list(results) == ["exact", "hnsw", "int8", "int8-no-rescore", "binary", "binary-no-rescore"]
    rng = np.random.default_rng(3)
    corpus, queries = random_unit(600, 40, rng), random_unit(25, 40, rng)
    assert np.allclose(np.linalg.norm(corpus, axis=1), 1, atol=1e-6)
    truth = np.argsort(-(queries @ corpus.T), axis=1)[:, :5]
    # the truth recall is measured against is brute force, so the exact index's 1.0 is a finding
    np.testing.assert_array_equal(true_neighbours(corpus, queries, 5), truth)
    assert results["exact"]["recall_at_k"] == 1.0
    assert recall_at_k(truth[:, [0, 1, 2, 3, 3]], truth) == pytest.approx(0.8)
    for name, r in results.items():
        assert 0 < r["recall_at_k"] <= 1 and r["queries_per_s"] > 0 and r["build_s"] >= 0, name
    # the sizes: 4 bytes a dimension, one a dimension and the graph, a bit a dimension
    assert 600 * 40 * 4 <= results["exact"]["index_bytes"] < 600 * 40 * 4 + 200
    assert 600 * 40 < results["int8"]["index_bytes"] < results["hnsw"]["index_bytes"]
    assert 600 * 5 <= results["binary"]["index_bytes"] < 600 * 5 + 200
    assert results["binary"]["recall_at_k"] > results["binary-no-rescore"]["recall_at_k"]
    assert out["info"]["corpus"] == 600 and out["info"]["queries"] == 25
    assert "| binary-no-rescore |" in capsys.readouterr().out


def test_given_vectors_hold_out_their_last_rows_as_queries(tmp_path):
    vectors = random_unit(300, 16, np.random.default_rng(0)) * 3  # not unit: scaled to it
    np.save(tmp_path / "v.npy", vectors)
    result = bench.run(["--search", str(tmp_path / "v.npy"), "--search-queries", "10", "--search-k", "3",
                        "--search-rounds", "1", "--search-indexes", "exact,binary", "--threads", "1", *QUIET])
    assert result["info"]["corpus"] == 290 and result["info"]["queries"] == 10
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    truth = np.argsort(-(unit[290:] @ unit[:290].T), axis=1)[:, :3]
    np.testing.assert_array_equal(true_neighbours(unit[:290], unit[290:], 3), truth)
    assert result["results"]["search"]["exact"]["recall_at_k"] == 1.0


def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    np.save(tmp_path / "ints.npy", np.zeros((5, 3), dtype=np.int64))
    (tmp_path / "bad.npy").write_text("no")
    cases = {"--search-indexes: unknown ivf": ["--search", "random", "--search-indexes", "exact,ivf"],
             "a int64 array of shape [5, 3]": ["--search", tmp_path / "ints.npy"],
             "not a readable .npy file": ["--search", tmp_path / "bad.npy"],
             "--search-k 5: the corpus holds 3 vectors": ["--search", "random", "--search-n", 3, "--search-k", 5],
             "fewer than --search-queries 1000 + 1": ["--search", tmp_path / "few.npy"]}
    np.save(tmp_path / "few.npy", np.ones((4, 3), dtype=np.float32))
    for message, argv in cases.items():
        assert run(*argv) == 2, message
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (message, err)
    monkeypatch.setitem(sys.modules, "faiss", None)
    assert run("--search", "random") == 2
    assert "pip install 'bertcf[search]'" in capsys.readouterr().err
