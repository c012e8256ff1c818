"""``python -m bertcf.search`` / ``bertcf-search``: a search index built from a corpus, and queries
against it (the library: ``bertcf.search``).

    python -m bertcf.search build --encoder MODEL (--corpus FILE [--column NAME] | --beir DIR) --out INDEX_DIR
                                  [--index exact|hnsw|int8|binary] [--calibration FILE] [--score cos|dot]
    python -m bertcf.search query --index INDEX_DIR (--query TEXT ... | --queries FILE) [-k 10] [--json FILE]

``build`` encodes the corpus (a text file, one document a line, its id the row number from 0; a
CSV/TSV column; or the corpus of a set in BEIR's layout, its ids BEIR's) a chunk at a time with the
model (a checkpoint or run directory under torch, or an ONNX export under ONNX Runtime, as
``bertcf-encode``), and writes INDEX_DIR (``bertcf.search.store``: the index, the vectors, the
documents and index.json, what built it). ``query`` encodes the queries with the model index.json
names (or ``--encoder``, which must give the same vectors) and prints each one's k nearest
documents. faiss is an optional extra: without it, one line says what to install.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..cli import AT_LEAST_1, ArgumentParser, run_main
from ..config.search import IndexConfig
from ..data import beir
from ..errors import DataError, UsageError
from ..evaluation.retrieval import SCORES, model_score
from ..search import directory as index_directory
from ..search import index as search_index
from ..search import store
from ..utils import progress
from ..utils.files import write_json_atomic
from .encode import Backend, add_backend_flags, calibration_vectors, check_column, encode_texts, read_sentences

QUERY_SETTINGS = ("ef_search", "rescore_multiplier", "no_rescore")


def add_encoder_flags(p: argparse.ArgumentParser, required: bool, calibration: tuple[str, str] | None = None) -> None:
    p.add_argument("--encoder", required=required, default=None,
                   help="a checkpoint or run directory (torch), or a directory written by bertcf-export onnx (onnx)"
                   + ("" if required else " (default: the model the index was built with)"))
    add_backend_flags(p, "--encoder", calibration)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m bertcf.search", description="Build a search index from a corpus, and query it.")
    commands = p.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    build = commands.add_parser("build", help="encode a corpus and write its search index",
                                description="Encode a corpus a chunk at a time and write its search index.")
    add_encoder_flags(build, required=True, calibration=("int8", "the corpus's vectors"))
    source = build.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="a text file (one document a line; ids: row numbers from 0), or a CSV/TSV "
                                         "file with --column")
    source.add_argument("--beir", metavar="DIR", help="a set in BEIR's layout: its corpus.jsonl (ids: its _id)")
    build.add_argument("--column", default=None, help="--corpus: the CSV/TSV column that holds the documents")
    build.add_argument("--out", required=True, help="the index directory to write (a new or empty one, or an index)")
    IndexConfig.add_arguments(build, only=("index", "hnsw_m", "ef_construction", "ef_search"))
    build.add_argument("--score", choices=SCORES, default=None,
                       help="cos (vectors scaled to unit length) or dot (default: the model's sentence-transformers "
                            "similarity_fn_name, else cos)")
    build.add_argument("--max-length", type=AT_LEAST_1, default=None, help="tokens per text (default: the model's)")
    build.add_argument("--truncate-dim", type=AT_LEAST_1, default=None,
                       help="index the vectors' first k dimensions (a Matryoshka-trained model's smaller widths)")
    build.add_argument("--chunk", type=AT_LEAST_1, default=store.CHUNK, help="documents encoded and added at a time")
    build.add_argument("--progress", choices=progress.MODES, default="auto", help="a bar, plain lines, or none")
    build.set_defaults(run=run_build)
    query = commands.add_parser("query", help="the nearest documents of queries in an index",
                                description="Print each query's k nearest documents in a search index.")
    query.add_argument("--index", required=True, metavar="INDEX_DIR", help="a directory written by build")
    asked = query.add_mutually_exclusive_group(required=True)
    asked.add_argument("--query", action="append", help="a query's text (again for more queries)")
    asked.add_argument("--queries", metavar="FILE", help="a text file of queries, one a line")
    query.add_argument("-k", type=AT_LEAST_1, default=10, help="documents per query")
    add_encoder_flags(query, required=False)
    IndexConfig.add_arguments(query, only=QUERY_SETTINGS)
    query.set_defaults(ef_search=None)  # the index's (index.json)
    query.add_argument("--json", default=None, help="also write the results to this JSON file")
    query.set_defaults(run=run_query)
    return p


def corpus(args) -> tuple[list[str], list[str]]:
    """(ids, texts) of --corpus or --beir."""
    if args.beir is not None:
        if args.column is not None:
            raise UsageError("--column reads a --corpus file; --beir reads corpus.jsonl")
        directory = Path(args.beir)
        if not directory.is_dir():
            raise DataError(f"--beir {directory}: no such directory (BEIR's layout: {beir.CORPUS}, ...)")
        documents = beir.read_corpus(directory / beir.CORPUS)
        return list(documents), list(documents.values())
    path = Path(args.corpus)
    check_column(path, args.column, "--corpus")
    texts = read_sentences(path, args.column, "--corpus")
    return [str(i) for i in range(len(texts))], texts


def run_build(args) -> dict:
    search_index.import_faiss()  # before the model loads
    settings = IndexConfig(**IndexConfig.pick(args))
    if args.calibration is not None and settings.index != "int8":
        raise UsageError("--calibration sets int8's ranges: give --index int8")
    with index_directory.hold(args.out):  # from before the model loads: a second build is refused at once
        index_directory.prepare(args.out)
        ids, texts = corpus(args)
        search_index.set_threads(args.threads)
        backend = Backend(args.encoder, args.backend, args.quantized, args.threads, args.device, args.max_length,
                          args.truncate_dim, args.precision)
        # an export's similarity is its checkpoint's (the export records where it came from)
        score = args.score or model_score(args.encoder if backend.onnx is None
                                          else backend.onnx.config.get("source") or args.encoder)
        calibration = calibration_vectors(backend, args.calibration, args.batch_size)
        model = {"name": args.encoder,
                 "path": str(Path(args.encoder).resolve()) if Path(args.encoder).exists() else None,
                 "backend": backend.name, "max_length": args.max_length, "truncate_dim": args.truncate_dim}
        shown = progress.Progress(args.progress, "build: encode", total=max(1, -(-len(texts) // args.chunk)))
        start = time.perf_counter()
        meta = store.build(args.out, lambda batch: encode_texts(backend, batch, args.batch_size), ids, texts,
                           settings.index, score, model, calibration, args.chunk,
                           progress=lambda done: shown.step(-(-done // args.chunk)), **settings.graph())
        shown.close()
    meta["seconds"] = time.perf_counter() - start
    print(f"{args.out}: {meta['kind']} index ({meta['precision']}) of {meta['documents']} documents, "
          f"{meta['dim']} dimensions, {meta['score']}; {meta['index_bytes'] / 1e6:,.2f} MB; "
          f"{meta['seconds']:,.1f} s")
    return meta


def query_encoder(args, meta: dict) -> Backend:
    """The model of the queries: --encoder, else the one the index was built with; refused (one
    line) when its vectors are not those of the index's model."""
    built = meta["model"]
    name = args.encoder or built.get("path") or built.get("name")
    backend = Backend(name, args.backend, args.quantized, args.threads, args.device, built.get("max_length"),
                      built.get("truncate_dim"), args.precision)
    store.check_model(meta, encode_texts(backend, store.PROBE_SENTENCES, args.batch_size), name)
    return backend


def run_query(args) -> dict:
    search_index.import_faiss()
    search_index.set_threads(args.threads)
    index, meta = store.load(args.index, ef_search=args.ef_search)
    queries = list(args.query) if args.query else read_sentences(Path(args.queries), None, "--queries")
    backend = query_encoder(args, meta)
    vectors = encode_texts(backend, queries, args.batch_size)
    if meta["score"] == "cos":
        vectors = store.unit(vectors)
    settings = IndexConfig(index=meta["kind"], **{k: getattr(args, k) for k in QUERY_SETTINGS
                                                  if getattr(args, k) is not None})
    start = time.perf_counter()
    scores, found = index.search(vectors, args.k, rescore_multiplier=settings.multiplier())
    seconds = time.perf_counter() - start
    ids, texts = store.read_documents(args.index, meta["documents"], meta)
    measure = "hamming" if meta["kind"] == "binary" and not settings.multiplier() else "score"
    results = [{"query": q, "hits": [{"id": ids[i], measure: float(s), "text": texts[i]}
                                     for s, i in zip(row_s, row_i) if i >= 0]}
               for q, row_s, row_i in zip(queries, scores.tolist(), found.tolist())]
    short = [len(r["hits"]) for r in results if len(r["hits"]) < args.k]
    if short:  # faiss pads the missing ranks with -1, dropped above: say so rather than print fewer silently
        print(f"note: fewer than -k {args.k} documents found for {len(short)} of {len(results)} queries (the fewest "
              f"{min(short)}): {short_reason(meta, args.k, min(short))}", file=sys.stderr)
    for result in results:
        print(f"query: {result['query']}")
        for rank, hit in enumerate(result["hits"], start=1):
            text = hit["text"] if len(hit["text"]) <= 100 else hit["text"][:97] + "..."
            value = f"{hit[measure]:>9.4f}" if measure == "score" else f"{hit[measure]:>5.0f} bits"
            print(f"  {rank:>3}  {value}  {hit['id']}  {text}")
    out = {"index": str(args.index), "kind": meta["kind"], "k": args.k, "seconds": seconds, "results": results}
    if args.json:
        write_json_atomic(args.json, out)
    return out


def short_reason(meta: dict, k: int, fewest: int) -> str:
    """Why a search found fewer than k documents: an index of fewer, or a graph search that did not
    reach them all."""
    reasons = [f"the index holds {meta['documents']} documents"] if meta["documents"] < k else []
    if meta["kind"] in ("hnsw", "int8") and fewest < min(k, meta["documents"]):
        reasons.append("an HNSW search finds only the documents its graph leads it to (a larger --ef-search "
                       "finds more)")
    return "; ".join(reasons) or "the search found no more"


def run(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    return args.run(args)


def main(argv=None) -> int:
    return run_main(run, argv)
