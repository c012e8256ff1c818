"""``--search VECTORS.npy|random``: the search indexes of ``bertcf.search.index`` on given vectors or
on N random unit vectors: for each index, its build time, its size, queries per second and
recall@k against exact search.

The corpus is a .npy of float vectors (its last ``--search-queries`` rows held out as the queries)
or ``--search-n`` random unit vectors of ``--search-dim`` dimensions (the queries: as many more),
drawn a chunk at a time from ``--seed``. Every vector is scaled to unit length (the cosine).
Each index is built once (a binary index serves its rescored and unrescored rows); its time covers
int8's ranges and the adding of every vector. Searching times all the queries in one call (faiss
spreads them over its threads), the median of ``--search-rounds`` rounds after one untimed; recall@k
is the mean over the queries of the share of exact search's k nearest that the index returns.
"""
from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path

import numpy as np

#: The rows of the table: (index kind, rescored).
VARIANTS = {"exact": ("exact", False), "hnsw": ("hnsw", False), "int8": ("int8", True),
            "int8-no-rescore": ("int8", False), "binary": ("binary", True), "binary-no-rescore": ("binary", False)}
DEFAULT_VARIANTS = ("exact", "hnsw", "int8", "binary", "binary-no-rescore")
CHUNK = 65_536


def random_unit(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random unit vectors [n, dim] float32 (Gaussian, normalised), drawn a chunk at a time."""
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, CHUNK):
        part = rng.standard_normal((min(CHUNK, n - start), dim), dtype=np.float32)
        out[start:start + len(part)] = part / np.linalg.norm(part, axis=1, keepdims=True)
    return out


def search_data(source: str, n: int, dim: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(corpus [N, D], queries [Q, D], a description): unit vectors, from a .npy or drawn at random."""
    from ..errors import DataError, UsageError
    from ..search.store import unit

    if source == "random":
        rng = np.random.default_rng(seed)
        return random_unit(n, dim, rng), random_unit(queries, dim, rng), f"{n:,} random unit vectors of {dim} dimensions"
    path = Path(source)
    try:
        vectors = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise DataError(f"--search {path}: not a readable .npy file ({type(e).__name__}); give a .npy of float "
                        f"vectors or 'random'") from None
    if vectors.ndim != 2 or not np.issubdtype(vectors.dtype, np.floating):
        raise DataError(f"--search {path}: a {vectors.dtype} array of shape {list(vectors.shape)}; give float vectors "
                        f"[n, dim]")
    if len(vectors) <= queries:
        raise UsageError(f"--search {path} holds {len(vectors)} vectors: fewer than --search-queries {queries} + 1")
    corpus = np.concatenate([unit(vectors[s:min(s + CHUNK, len(vectors) - queries)])
                             for s in range(0, len(vectors) - queries, CHUNK)])
    return corpus, unit(vectors[len(vectors) - queries:]), f"{path}: {len(corpus):,} vectors of {vectors.shape[1]} " \
                                                          f"dimensions, the last {queries} held out as queries"


def timed_search(index, queries: np.ndarray, k: int, multiplier: int, rounds: int) -> tuple[np.ndarray, list[float]]:
    """The ids [Q, k] of a search of every query, and the seconds of ``rounds`` rounds after one untimed."""
    _, ids = index.search(queries, k, rescore_multiplier=multiplier)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        index.search(queries, k, rescore_multiplier=multiplier)
        times.append(time.perf_counter() - start)
    return ids, times


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over the rows of |found ∩ truth| / k."""
    k = truth.shape[1]
    return float(np.mean([len(set(f.tolist()) & set(t.tolist())) / k for f, t in zip(found, truth)]))


def true_neighbours(corpus: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """The k nearest corpus rows of each query by brute force [Q, k] (inner products, in chunks):
    the truth every index's recall is measured against, the exact index's included."""
    import torch

    from ..utils.topk import nearest
    return nearest(torch.from_numpy(queries), torch.from_numpy(corpus), k, 8192)[1].numpy()  # [Q, 8192] at once


def measure(variants, corpus, queries, k: int, settings, rounds: int) -> dict:
    """Each variant's build seconds, index bytes, queries/s and recall@k (the table's rows)."""
    from ..search.store import build_index

    built, results, truth = {}, {}, true_neighbours(corpus, queries, k)
    for name in variants:
        kind, rescored = VARIANTS[name]
        if kind not in built:
            built.clear()  # one index in memory at a time (a binary one serves both its rows)
            start = time.perf_counter()
            built[kind] = (build_index(corpus, kind, normalize=False, chunk=CHUNK, **settings.graph()),
                           time.perf_counter() - start)
        index, build_seconds = built[kind]
        multiplier = settings.rescore_multiplier if rescored else 0
        ids, times = timed_search(index, queries, k, multiplier, rounds)
        seconds = statistics.median(times)
        results[name] = {"kind": kind, "rescore_multiplier": multiplier or None, "build_s": build_seconds,
                         "index_bytes": index.nbytes, "bytes_per_vector": index.nbytes / len(corpus),
                         "search_s": seconds, "queries_per_s": len(queries) / seconds,
                         "recall_at_k": recall_at_k(ids, truth), "times_s": times}
        r = results[name]
        print(f"{name:18s} built in {build_seconds:8.2f} s, {r['index_bytes'] / 1e6:10.1f} MB, "
              f"{r['queries_per_s']:12,.0f} queries/s, recall@{k} {r['recall_at_k']:.4f}", flush=True)
    return results


def run_search(args, settings) -> dict:
    """``--search``: every index of ``--search-indexes`` measured; ``settings``: an IndexConfig. Its
    table (``print_search``) and JSON come from the command, once the run's load was judged."""
    from ..errors import UsageError
    from ..search.index import import_faiss, set_threads

    faiss = import_faiss()
    variants = [v.strip() for v in args.search_indexes.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise UsageError(f"--search-indexes: unknown {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(VARIANTS)}")
    set_threads(args.threads)
    corpus, queries, described = search_data(args.search, args.search_n, args.search_dim, args.search_queries, args.seed)
    if args.search_k > len(corpus):
        raise UsageError(f"--search-k {args.search_k}: the corpus holds {len(corpus)} vectors")
    info = {"data": described, "corpus": len(corpus), "dim": corpus.shape[1], "queries": len(queries),
            "k": args.search_k, "settings": settings.graph() | {"rescore_multiplier": settings.rescore_multiplier},
            "faiss": faiss.__version__, "threads": faiss.omp_get_max_threads(), "cpu": platform.processor() or
            platform.machine(), "python": platform.python_version(), "rounds": args.search_rounds}
    print(f"bench --search: {described}; {len(queries)} queries, k {args.search_k}; faiss {faiss.__version__}, "
          f"{info['threads']} threads; median of {args.search_rounds} rounds after one", flush=True)
    results = measure(variants, corpus, queries, args.search_k, settings, args.search_rounds)
    return {"info": info, "results": {"search": results}}


def print_search(out: dict) -> None:
    """``--search``'s table, once the run's load was judged (``bertcf.commands.bench.run``)."""
    k = out["info"]["k"]
    print(f"\n| index | build s | index MB | bytes/vector | queries/s | recall@{k} |")
    print("|---|---|---|---|---|---|")
    for name, r in out["results"]["search"].items():
        print(f"| {name} | {r['build_s']:.2f} | {r['index_bytes'] / 1e6:,.1f} | {r['bytes_per_vector']:.1f} | "
              f"{r['queries_per_s']:,.0f} | {r['recall_at_k']:.4f} |")
