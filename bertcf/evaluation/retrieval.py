"""Dense retrieval on a BEIR-layout set (``bertcf.data.beir``): exact search over the whole corpus,
scored as BEIR and sentence-transformers score it.

Search. The queries are encoded once; the corpus is encoded a chunk at a time, each chunk scored
against every query in blocks of queries (a block's scores are [queries, chunk]) and its best hits
merged into each query's running top k. Memory holds the query vectors, one chunk's vectors and
one block of scores, never the corpus's vectors or the full score matrix. Scores are the cosine of the vectors (``cos``) or their dot
product (``dot``); for an encoder that normalises its vectors the two are the same.

Ties. Documents with the same score are ranked by their ids, in ascending string order, as
sentence-transformers' InformationRetrievalEvaluator ranks them: the corpus is searched in id
order and every merge keeps, among equal scores, the lower position first.

Indexes (``index``, ``python -m bertcf.evaluate --index``). ``exact`` is the search above; ``hnsw``,
``int8`` and ``binary`` put the corpus's vectors (written a chunk at a time to a temporary .npy)
into that kind of ``bertcf.search.index.VectorIndex`` (faiss, an optional extra) and take each
query's k + 1 nearest from it, the rescored ones for int8 and binary (``rescore_multiplier`` × k
candidates; 0: none), less the query's own id; int8's ranges are the corpus's. The metrics are the same.

Identical ids. As BEIR's evaluation does (``ignore_identical_ids``, on by default), a document
whose id is the query's is never retrieved for it; BEIR's Quora gives each query the id of its own
copy in the corpus. sentence-transformers' evaluator does not skip them.

Metrics, mean over the queries with at least one relevant document (qrels score > 0), with the
ranked list cut at k:

* nDCG@k: DCG = sum of gain / log2(rank + 1) over the retrieved documents, gain = the qrels score
  (trec_eval's and BEIR's graded gain; sentence-transformers counts every relevant document as 1,
  which is the same for the usual binary qrels), over the DCG of the ideal ranking of the query's
  judged documents;
* MRR@k: 1 / the rank of the first relevant document (0 if none in the top k);
* Recall@k: relevant documents retrieved / the query's relevant documents (those not in the corpus
  included);
* MAP@k: the sum of the precision at the rank of each relevant document retrieved, over
  min(k, relevant documents): sentence-transformers' definition (trec_eval's map_cut divides by
  the number of relevant documents; the two differ only for a query with more than k of them).

Reranking (``rerank``). Each query's first K documents of the search are scored again, each as a
(query, document) pair by a cross-encoder, and put in the order of those scores, highest first
(equal scores keep the search's order); the documents the search ranked after K follow in its
order. The metrics are then those of the new lists, beside the search's own (``first_stage``).

Time. ``index_seconds``: encoding the corpus (done once, offline, in a deployed system);
``search_seconds``: encoding the queries and the exact search; ``rerank_seconds``: the cross-
encoder's scores; ``queries_per_second``: the queries over the search's (and the reranking's) time.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from ..runs import resolve_encoder_path
from ..search.index import KINDS, RESCORE_MULTIPLIER
from ..utils.progress import Progress, mode_of
from ..utils.topk import TopK

SCORES = ("cos", "dot")
ENCODE_SLICE = 4096  # texts encoded at once (each call sorts its texts by length), between progress updates
RERANK_PAIRS = 1024  # (query, document) pairs a reranking scores at once, at least a query's (between progress updates)


def model_score(path) -> str:
    """The score a sentence-transformers checkpoint asks for: ``similarity_fn_name`` in its
    config_sentence_transformers.json ("cosine" -> cos, "dot" -> dot), else cos (what
    sentence-transformers uses when a model names none). ``path``: a checkpoint or run directory."""
    config = Path(resolve_encoder_path(path)) / "config_sentence_transformers.json"
    try:
        name = json.loads(config.read_text()).get("similarity_fn_name") if config.is_file() else None
    except (ValueError, OSError, AttributeError):
        name = None
    return {"dot": "dot", "dot_product": "dot"}.get(name, "cos")


def ranking_metrics(ranked: list[list[str]], qrels: list[dict[str, int]], ndcg_at=(10,), mrr_at=(10,),
                    recall_at=(100,), map_at=(100,)) -> dict:
    """The mean nDCG, MRR, Recall and MAP at each cut-off (see the module's docstring) of the
    ranked document ids of each query against its judgements {id: score}; {"ndcg@10": ..., ...}."""
    per_query = {f"{name}@{k}": [] for name, ks in (("ndcg", ndcg_at), ("mrr", mrr_at), ("recall", recall_at),
                                                    ("map", map_at)) for k in ks}
    for docs, judged in zip(ranked, qrels):
        relevant = {d: s for d, s in judged.items() if s > 0}
        gains = np.array([relevant.get(d, 0) for d in docs], dtype=np.float64)
        hit = gains > 0
        discount = 1.0 / np.log2(np.arange(2, len(docs) + 2))
        ideal = np.sort(np.array(list(relevant.values()), dtype=np.float64))[::-1]
        for k in ndcg_at:
            best = (ideal[:k] / np.log2(np.arange(2, min(k, len(ideal)) + 2))).sum()
            per_query[f"ndcg@{k}"].append((gains[:k] * discount[:k]).sum() / best)
        for k in mrr_at:
            first = np.flatnonzero(hit[:k])
            per_query[f"mrr@{k}"].append(1.0 / (first[0] + 1) if len(first) else 0.0)
        for k in recall_at:
            per_query[f"recall@{k}"].append(hit[:k].sum() / len(relevant))
        for k in map_at:
            precision = np.cumsum(hit[:k]) / np.arange(1, len(hit[:k]) + 1)
            per_query[f"map@{k}"].append((precision * hit[:k]).sum() / min(k, len(relevant)))
    return {name: float(np.mean(values)) for name, values in per_query.items()}


class RetrievalEvaluator:
    """nDCG@10 (the main metric), MRR@10, Recall@100 and MAP@100 of exact dense retrieval on a
    BEIR-layout set (``data``: a :class:`bertcf.data.beir.RetrievalSet`). ``score``: "cos" or "dot";
    ``corpus_chunk`` documents encoded and scored at a time, against ``query_block`` queries at a
    time; ``index``: "exact", or a search index of kind "hnsw", "int8" or "binary", with
    ``index_settings`` (see the module's docstring). ``__call__(encode)``: ``encode(list of n texts)
    -> [n, D]`` float32."""

    main_metric = "ndcg@10"

    def __init__(self, name: str, data, score: str = "cos", ndcg_at=(10,), mrr_at=(10,), recall_at=(100,),
                 map_at=(100,), corpus_chunk: int = 50_000, query_block: int = 256, ignore_identical_ids: bool = True,
                 index: str = "exact", index_settings: dict | None = None):
        if score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(SCORES)}, not {score!r}")
        if index not in KINDS:  # exact here: the search above, not faiss's
            raise ValueError(f"index must be one of {', '.join(KINDS)}, not {index!r}")
        # hnsw_m, ef_construction, ef_search (the graph's), rescore_multiplier (int8, binary; 0: none),
        # bertcf.search.index's defaults where not given
        self.index, self.index_settings = index, dict(index_settings or {})
        self.name, self.score = name, score
        self.cutoffs = {"ndcg_at": tuple(ndcg_at), "mrr_at": tuple(mrr_at), "recall_at": tuple(recall_at),
                        "map_at": tuple(map_at)}
        self.corpus_ids = sorted(data.corpus)  # id order: ties go to the lower id
        self.corpus = [data.corpus[i] for i in self.corpus_ids]
        self.query_ids = list(data.queries)
        self.queries = [data.queries[q] for q in self.query_ids]
        self.qrels = [data.qrels[q] for q in self.query_ids]
        self.corpus_chunk, self.query_block = corpus_chunk, query_block
        self.ignore_identical_ids = ignore_identical_ids
        self.timing: dict = {}  # the last search's times (search)

    def _vectors(self, encode, texts, bar) -> torch.Tensor:
        """The vectors of ``texts``, encoded a slice at a time so that the bar moves."""
        parts = []
        for start in range(0, len(texts), ENCODE_SLICE):
            parts.append(encode(texts[start:start + ENCODE_SLICE]).float())
            bar.update(len(parts[-1]))
        vectors = torch.cat(parts)
        return F.normalize(vectors, dim=-1) if self.score == "cos" else vectors

    def depth(self) -> int:
        """How many documents a search keeps per query: the largest cut-off."""
        return max(max(ks) for ks in self.cutoffs.values())

    def search(self, encode, show_progress_bar: bool = False, depth: int | None = None) -> TopK:
        """Each query's top ``depth`` (default :meth:`depth`) over the whole corpus; ``self.timing``
        then holds its ``index_seconds`` (the corpus encoded) and ``search_seconds`` (the rest)."""
        k = depth or self.depth()
        position = {d: i for i, d in enumerate(self.corpus_ids)} if self.ignore_identical_ids else {}
        own = torch.tensor([position.get(q, -1) for q in self.query_ids], dtype=torch.long)
        top = TopK(len(self.queries), k)
        bar = Progress(mode_of(show_progress_bar), f"{self.name}: queries + corpus encoded",
                       len(self.queries) + len(self.corpus), unit="text")
        started, index = time.perf_counter(), 0.0
        with bar:
            queries = self._vectors(encode, self.queries, bar)
            for start in range(0, len(self.corpus), self.corpus_chunk):
                encoding = time.perf_counter()
                docs = self._vectors(encode, self.corpus[start:start + self.corpus_chunk], bar)
                index += time.perf_counter() - encoding
                for first in range(0, len(queries), self.query_block):
                    scores = queries[first:first + self.query_block] @ docs.T
                    mine = own[first:first + self.query_block] - start
                    inside = (mine >= 0) & (mine < len(docs))
                    scores[inside.nonzero()[:, 0], mine[inside]] = -math.inf  # BEIR: never the query itself
                    top.update(first, scores, start)
        self.timing = {"index_seconds": index, "search_seconds": time.perf_counter() - started - index}
        return top

    def search_index(self, encode, show_progress_bar: bool = False, depth: int | None = None) -> list[list[int]]:
        """Each query's top ``depth`` (default :meth:`depth`) corpus positions from an index of kind
        ``self.index`` (see the module's docstring), best first; ``self.timing`` then holds its
        ``index_seconds`` (the corpus encoded and indexed) and ``search_seconds`` (the rest)."""
        import tempfile

        from ..search.store import build_index, encode_to_file

        k = depth or self.depth()
        settings = dict(self.index_settings)
        multiplier = settings.pop("rescore_multiplier", RESCORE_MULTIPLIER)
        bar = Progress(mode_of(show_progress_bar), f"{self.name}: queries + corpus encoded",
                       len(self.queries) + len(self.corpus), unit="text")
        started = time.perf_counter()
        with bar, tempfile.TemporaryDirectory(prefix="bertcf-retrieval-") as tmp:
            queries = self._vectors(encode, self.queries, bar).numpy()
            indexing = time.perf_counter()
            vectors = encode_to_file(lambda texts: self._vectors(encode, texts, bar).numpy(), self.corpus,
                                     Path(tmp) / "vectors.npy", self.corpus_chunk)
            index = build_index(vectors, self.index, normalize=False, chunk=self.corpus_chunk, **settings)
            del vectors
            built = time.perf_counter()
        _, found = index.search(queries, k + 1 if self.ignore_identical_ids else k, rescore_multiplier=multiplier)
        self.timing = {"index_seconds": built - indexing, "search_seconds": time.perf_counter() - started
                       - (built - indexing)}
        position = {d: i for i, d in enumerate(self.corpus_ids)} if self.ignore_identical_ids else {}
        return [[i for i in row if i >= 0 and i != position.get(q, -1)][:k]
                for q, row in zip(self.query_ids, found.tolist())]

    @staticmethod
    def _positions(top: TopK) -> list[list[int]]:
        """Each query's retrieved documents (corpus positions), best first."""
        return [[i for i, v in zip(row_i, row_v) if v > -math.inf]
                for row_i, row_v in zip(top.indices.tolist(), top.values.tolist())]

    def rerank(self, positions: list[list[int]], score_pairs, depth: int,
               show_progress_bar: bool = False) -> list[list[str]]:
        """Each query's ranked document ids after reranking its first ``depth`` of ``positions``
        (see the module's docstring): ``score_pairs(list of (query, document) texts) -> [n]``
        scores, a block of queries at a time."""
        ranked, blocks, first = [], [], 0
        while first < len(self.queries):  # whole queries, about RERANK_PAIRS pairs a block
            last, pairs = first, 0
            while last < len(self.queries) and (last == first or pairs + len(positions[last][:depth]) <= RERANK_PAIRS):
                pairs, last = pairs + len(positions[last][:depth]), last + 1
            blocks.append((first, last, pairs))
            first = last
        with Progress(mode_of(show_progress_bar), f"{self.name}: rerank", sum(b[2] for b in blocks),
                      unit="pair") as shown:
            for first, last, _ in blocks:
                heads = positions[first:last]
                pairs = [(self.queries[first + q], self.corpus[i]) for q, head in enumerate(heads)
                         for i in head[:depth]]
                scores = score_pairs(pairs) if pairs else torch.empty(0)
                for head, part in zip(heads, scores.split([len(h[:depth]) for h in heads])):
                    order = torch.argsort(part, descending=True, stable=True).tolist()
                    ranked.append([self.corpus_ids[head[j]] for j in order] +
                                  [self.corpus_ids[i] for i in head[depth:]])
                shown.advance(len(pairs))
        return ranked

    def __call__(self, encode, show_progress_bar: bool = False, rerank=None, rerank_top: int = 100) -> dict:
        """The metrics of the search (exact, or through ``self.index``; and, with ``rerank``, a
        ``score_pairs`` as :meth:`rerank` takes, of its reranking of each query's ``rerank_top``),
        the set's size and the times."""
        depth = max(self.depth(), rerank_top) if rerank else None
        if self.index == "exact":
            positions = self._positions(self.search(encode, show_progress_bar, depth))
        else:
            positions = self.search_index(encode, show_progress_bar, depth)
        searched = [[self.corpus_ids[i] for i in row] for row in positions]
        rescored = self.index in ("int8", "binary") and self.index_settings.get("rescore_multiplier",
                                                                                 RESCORE_MULTIPLIER) or None
        info = {"score": self.score, "queries": len(self.queries), "corpus": len(self.corpus),
                "ignore_identical_ids": self.ignore_identical_ids, "index": self.index,
                "rescore_multiplier": rescored} | self.timing
        first = ranking_metrics(searched, self.qrels, **self.cutoffs) | {
            "queries_per_second": len(self.queries) / max(self.timing["search_seconds"], 1e-9)}
        if rerank is None:
            return first | info
        started = time.perf_counter()
        reranked = self.rerank(positions, rerank, rerank_top, show_progress_bar)
        seconds = time.perf_counter() - started
        return ranking_metrics(reranked, self.qrels, **self.cutoffs) | info | {
            "rerank_top": rerank_top, "rerank_seconds": seconds, "first_stage": first,
            "queries_per_second": len(self.queries) / max(self.timing["search_seconds"] + seconds, 1e-9)}


def evaluate_retrieval(encoder, data, name: str, score: str, batch_size: int = 64,
                       show_progress_bar: bool = False, reranker=None, rerank_top: int = 100, **settings) -> dict:
    """:class:`RetrievalEvaluator` on a SentenceEncoder (texts up to its own ``max_length``, as
    sentence-transformers encodes them); the scores with ``name`` (the set), ``score`` and
    ``normalized`` (whether the encoder returns unit vectors: then cos and dot are the same).
    ``settings``: RetrievalEvaluator's (``index``, ``index_settings``, the cut-offs, ...);
    ``reranker``: a cross-encoder that reranks each query's ``rerank_top`` (its relevance, as
    ``CrossEncoder.relevance``, ``batch_size`` pairs at a time)."""
    evaluator = RetrievalEvaluator(name, data, score=score, **settings)
    rerank = None if reranker is None else lambda pairs: reranker.relevance(pairs, batch_size)
    result = evaluator(lambda texts: encoder.encode(texts, batch_size=batch_size), show_progress_bar, rerank,
                       rerank_top)
    return {"dir": name} | result | {"normalized": bool(encoder.normalize)}


def format_retrieval(result: dict) -> str:
    """One table: the set, its size, the score, the four metrics (×100, as BEIR's tables) and the
    queries per second; with a reranking, a row for the search and one for the reranked lists."""
    names = [n for n in result if "@" in n]
    heads = ["set", "queries", "corpus", "score", "index"] + [n.replace("ndcg", "nDCG").replace("mrr", "MRR").replace(
        "recall", "Recall").replace("map", "MAP") for n in names] + ["queries/s"]
    index = result.get("index", "exact") + (f", rescored {result['rescore_multiplier']}k" if result.get(
        "rescore_multiplier") else ", not rescored" if result.get("index") in ("int8", "binary") else "")
    stages = [(result["score"], result["first_stage"]), (f"+ rerank@{result['rerank_top']}", result)] \
        if "first_stage" in result else [(result["score"], result)]
    rows = [[str(result["dir"]), str(result["queries"]), str(result["corpus"]), label, index]
            + [f"{100 * metrics[n]:.2f}" for n in names] + [f"{metrics['queries_per_second']:.1f}"]
            for label, metrics in stages]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    line = lambda items: "| " + " | ".join(i.rjust(w) for i, w in zip(items, widths)) + " |"  # noqa: E731
    return "\n".join([rule, line(heads), rule, *map(line, rows), rule])
