"""``python -m bertcf.data COMMAND``: ``download`` (the CS224N files, Wiki1M and SentEval's data,
verified; ``bertcf.data.download``), ``beir-quora`` (a BEIR-layout retrieval set from the CS224N
Quora files; ``bertcf.data.beir``), ``mine-negatives`` (hard negatives for (query, positive)
pairs; ``bertcf.data.negatives``) and ``genq`` (queries a seq2seq generator writes for a corpus's
passages, in BEIR's layout; ``bertcf.data.genq``). The first two import no torch, so the
downloader runs on a fresh machine."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..data import beir, download
from ..errors import DataError, WriteError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bertcf.data",
                                     description="BERT-CF data tools (see data/README.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    add_download(commands)
    add_beir_quora(commands)
    add_mine_negatives(commands)
    add_genq(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)



def add_download(commands) -> None:
    """``download``: the subcommand of ``python -m bertcf.data``."""
    get = commands.add_parser(
        "download", help="download and verify the CS224N task files and Wiki1M",
        description="Download the CS224N task files and/or Wiki1M into --out, verifying "
                    "checksums; files already present and valid are skipped.")
    get.add_argument("--out", default="data", help="directory to put the files in (default: data)")
    get.add_argument("--only", choices=sorted(download.SOURCES), help="download only this dataset")
    get.add_argument("--senteval", action="store_true",
                     help="download SentEval's evaluation data (SimCSE's senteval.tar) into OUT/SentEval instead")
    get.add_argument("--timeout", type=float, default=60.0,
                     help="network timeout in seconds for each connect/read (default: 60)")
    get.add_argument("--base-url", default=download.data_url(),
                     help=f"fetch every file from BASE_URL/<name> (a mirror; default: ${download.DATA_URL_ENV} when set)")
    get.add_argument("--no-progress", action="store_true", help="no progress bars")
    get.set_defaults(run=run_download)


def run_download(args) -> int:
    """The ``download`` subcommand: 0 when every requested file is valid, 1 otherwise."""
    if args.senteval:
        if args.only:
            print("python -m bertcf.data download: error: --senteval and --only exclude each other", file=sys.stderr)
            return 2
        try:
            download.download_senteval(args.out, timeout=args.timeout, base_url=args.base_url, progress=not args.no_progress)
        except DataError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        return 0
    try:
        results = download.download(args.out, args.only, timeout=args.timeout, base_url=args.base_url,
                           progress=not args.no_progress)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    failed = [name for name, problem in results.items() if problem is not None]
    if failed:
        print(f"{len(failed)} of {len(results)} files failed: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    print(f"{args.out}: all {len(results)} requested file(s) are valid")
    return 0


def add_beir_quora(commands) -> None:
    """``beir-quora``: the subcommand of ``python -m bertcf.data``."""
    p = commands.add_parser(
        "beir-quora", help="build a BEIR-layout duplicate-question retrieval set from the CS224N Quora files",
        description="Queries: the first question of each duplicate pair of --queries-from; relevant: its "
                    "duplicate; corpus: every distinct question of the Quora files in --data-dir (as BEIR's "
                    "Quora task). Writes OUT/corpus.jsonl, OUT/queries.jsonl and OUT/qrels/test.tsv.")
    p.add_argument("--data-dir", default="data", help="directory with the CS224N files (default: data)")
    p.add_argument("--out", required=True, help="directory to write the set to (replaced as a whole)")
    p.add_argument("--queries-from", default="dev",
                   help="comma-separated labelled splits whose duplicate pairs make the queries: train, dev "
                        "(default: dev; the multitask stage trains on quora-train)")
    p.add_argument("--exclude-questions-of", default="",
                   help="comma-separated splits (dev): leave out every pair with a question of their duplicate pairs, "
                        "so that a set to train on shares no query or relevant document with the set built from them")
    p.add_argument("--split", default="test", choices=("test", "train", "dev"),
                   help="the qrels file to write, OUT/qrels/SPLIT.tsv (default: test, what the evaluation reads; "
                        "train: what --method simcse-sup and python -m bertcf.gpl --queries train on)")
    p.set_defaults(run=run_beir_quora)


def run_beir_quora(args) -> int:
    splits = tuple(s.strip() for s in args.queries_from.split(",") if s.strip())
    bad = [s for s in splits if s not in ("train", "dev")]
    if bad or not splits:
        print(f"python -m bertcf.data beir-quora: error: --queries-from takes train and/or dev, not "
              f"{args.queries_from!r}", file=sys.stderr)
        return 2
    exclude = tuple(s.strip() for s in args.exclude_questions_of.split(",") if s.strip())
    if set(exclude) - {"train", "dev"} or set(exclude) & set(splits):
        print(f"python -m bertcf.data beir-quora: error: --exclude-questions-of takes train and/or dev, not those of "
              f"--queries-from: {args.exclude_questions_of!r}", file=sys.stderr)
        return 2
    try:
        built = beir.build_quora(args.data_dir, splits, exclude)
        beir.write(args.out, built.corpus, built.queries, built.qrels, split=args.split)
    except (DataError, WriteError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    relevant = sum(len(d) for d in built.qrels.values())
    print(f"{args.out}: {len(built.queries)} queries (duplicate pairs of {', '.join(splits)}), "
          f"{len(built.corpus)} documents, {relevant} relevant pairs (qrels/{args.split}.tsv)")
    return 0


def add_mine_negatives(commands) -> None:
    """``mine-negatives``: the subcommand of ``python -m bertcf.data``."""
    from ..cli import AT_LEAST_0, AT_LEAST_1

    p = commands.add_parser(
        "mine-negatives", help="mine hard negatives for (query, positive) pairs with an encoder",
        description="For each (query, positive) pair, the corpus entries the encoder ranks nearest that are not a "
                    "positive, filtered and drawn as sentence-transformers' mine_hard_negatives; written as "
                    "anchor<TAB>positive<TAB>negative rows (one per negative) that --method simcse-sup trains on.")
    p.add_argument("--encoder", required=True, help="a checkpoint, run directory or Hugging Face BERT name/directory")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--pairs", help="a file of query<TAB>positive lines")
    source.add_argument("--nli", help="an NLI file: its entailment pairs (premise, hypothesis)")
    source.add_argument("--beir", help="a set in BEIR's layout: its queries and relevant documents; its corpus the "
                                       "candidates")
    p.add_argument("--corpus", help="more candidates, one a line (default: the positives, and a BEIR set's corpus)")
    p.add_argument("--out", required=True, help="the triplets file to write (anchor, positive, negative)")
    p.add_argument("--num-negatives", type=AT_LEAST_1, default=3, help="negatives per pair (default: 3)")
    p.add_argument("--range-min", type=AT_LEAST_0, default=0,
                   help="skip this many nearest candidates (likely unlabelled positives) (default: 0)")
    p.add_argument("--range-max", type=AT_LEAST_1, default=None,
                   help="consider candidates up to this rank (default: range-min + negatives + the most positives a "
                        "query has, ten times the negatives with a margin or --max-score)")
    p.add_argument("--max-score", type=float, default=None, help="skip candidates scoring above this cosine")
    p.add_argument("--min-score", type=float, default=None, help="skip candidates scoring below this cosine")
    p.add_argument("--absolute-margin", type=float, default=None,
                   help="keep a candidate only if it scores at least this much below the query's positive")
    p.add_argument("--relative-margin", type=float, default=None,
                   help="keep a candidate only if it scores this share of the positive's magnitude below it")
    p.add_argument("--sampling", choices=("top", "random"), default="top",
                   help="the best remaining candidates, or a seeded random draw among them (default: top)")
    p.add_argument("--seed", type=int, default=0, help="the random draw's seed (default: 0)")
    p.add_argument("--chunk-size", type=AT_LEAST_1, default=16384,
                   help="queries and corpus entries scored at once: memory stays O(chunk^2) (default: 16384)")
    p.add_argument("--batch-size", type=AT_LEAST_1, default=64, help="sentences encoded at once (default: 64)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=run_mine_negatives)


def run_mine_negatives(args) -> int:
    from ..cli import run_main
    return run_main(lambda _: mine_negatives(args))


def mine_negatives(args) -> dict:
    """The ``mine-negatives`` subcommand: read the pairs, encode, mine, write (bad input: one line, 2)."""
    from ..data import negatives  # torch: not for the downloader
    from ..data.reading import read_lines
    from ..models.encoder import SentenceEncoder
    from ..utils.precision import resolve_device

    if args.pairs:
        queries, positives = negatives.read_query_pairs(args.pairs)
        corpus = []
    elif args.nli:
        queries, positives = negatives.nli_pairs(args.nli)
        corpus = []
    else:
        queries, positives, corpus = negatives.beir_pairs(args.beir)
    if args.corpus:
        corpus += [line.strip() for line in read_lines(Path(args.corpus), "corpus file") if line.strip()]
    settings = negatives.Mining(args.num_negatives, args.range_min, args.range_max, args.max_score, args.min_score,
                                args.absolute_margin, args.relative_margin, args.sampling, args.seed, args.chunk_size)
    encoder = SentenceEncoder.from_pretrained(args.encoder).to(resolve_device(args.device))

    def embed(texts):
        return encoder.encode(texts, batch_size=args.batch_size, show_progress_bar=not args.no_progress,
                              normalize=True)
    rows = negatives.mine(queries, positives, corpus, embed, settings)
    negatives.write_triplets(args.out, rows)
    pairs = len(dict.fromkeys(zip(queries, positives)))
    print(f"{args.out}: {len(rows)} (anchor, positive, negative) rows for {pairs} pairs "
          f"({len(rows) / max(pairs, 1):.2f} negatives a pair; asked {args.num_negatives})")
    return {"rows": len(rows), "pairs": pairs}


def add_genq(commands) -> None:
    """``genq``: the subcommand of ``python -m bertcf.data``."""
    from ..cli import AT_LEAST_1, AT_LEAST_2, TOP_P
    from ..data.genq import DEFAULT_GENERATOR, Generation

    d = Generation()
    p = commands.add_parser(
        "genq", help="write queries for a corpus's passages with a seq2seq query generator (GenQ), in BEIR's layout",
        description="GenQ (BEIR, Thakur et al. 2021): for each passage of --corpus, queries sampled from --generator "
                    "as BEIR's query generator samples them (nucleus sampling, top-p 0.95, top-k 25, 64 tokens); "
                    "writes OUT/corpus.jsonl, OUT/queries.jsonl and OUT/qrels/train.tsv, which run_pretrain.py "
                    "--stage supervised --method simcse-sup --negatives simcse --train-file OUT trains on (MNRL).")
    p.add_argument("--corpus", required=True, help="the passages: a set in BEIR's layout (its corpus.jsonl), a BEIR "
                                                   "corpus .jsonl, or a text file of one passage a line")
    p.add_argument("--out", required=True, help="the directory to write (replaced as a whole)")
    p.add_argument("--generator", default=DEFAULT_GENERATOR,
                   help="a seq2seq query generator: a Hugging Face name or directory (transformers' "
                        "AutoModelForSeq2SeqLM)")
    p.add_argument("--queries-per-passage", type=AT_LEAST_1, default=d.queries_per_passage,
                   help="sequences sampled per passage; repeats are kept once")
    p.add_argument("--top-p", type=TOP_P, default=d.top_p,
                   help="nucleus sampling's probability mass")
    p.add_argument("--top-k", type=AT_LEAST_1, default=d.top_k, help="sample among the k likeliest tokens")
    p.add_argument("--query-max-length", type=AT_LEAST_2, default=d.max_length,
                   help="tokens per query, at most")
    p.add_argument("--batch-size", type=AT_LEAST_1, default=d.batch_size, help="passages at once")
    p.add_argument("--seed", type=int, default=d.seed, help="the draws' seed")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run_genq)


def run_genq(args) -> int:
    from ..cli import run_main
    return run_main(lambda _: genq(args))


def genq(args) -> dict:
    """The ``genq`` subcommand: read the passages, load the generator, generate, write (bad input: one line, 2)."""
    from ..data import genq as generation  # torch and transformers: not for the downloader
    from ..utils.precision import resolve_device

    passages = generation.read_passages(args.corpus)
    settings = generation.Generation(args.queries_per_passage, args.top_p, args.top_k, args.query_max_length,
                                     args.batch_size, args.seed)
    model, tokenizer = generation.load_generator(args.generator, resolve_device(args.device))
    queries, qrels = generation.generate(passages, model, tokenizer, settings, show_progress_bar=not args.no_progress)
    generation.write(args.out, passages, queries, qrels)
    print(f"{args.out}: {len(queries)} queries for {len(passages)} passages ({len(queries) / len(passages):.2f} a "
          f"passage; {args.queries_per_passage} drawn)")
    return {"queries": len(queries), "passages": len(passages)}
