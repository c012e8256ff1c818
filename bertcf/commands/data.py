"""``python -m bertcf.data COMMAND``: ``download`` (the CS224N files, Wiki1M and SentEval's data,
verified; ``bertcf.data.download``) and ``beir-quora`` (a BEIR-layout retrieval set from the CS224N
Quora files; ``bertcf.data.beir``). Neither imports torch, so the downloader runs on a fresh machine."""
from __future__ import annotations

import argparse
import sys

from ..data import beir, download
from ..errors import DataError, WriteError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bertcf.data",
                                     description="BERT-CF data tools (see data/README.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    add_download(commands)
    add_beir_quora(commands)
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
    p.set_defaults(run=run_beir_quora)


def run_beir_quora(args) -> int:
    splits = tuple(s.strip() for s in args.queries_from.split(",") if s.strip())
    bad = [s for s in splits if s not in ("train", "dev")]
    if bad or not splits:
        print(f"python -m bertcf.data beir-quora: error: --queries-from takes train and/or dev, not "
              f"{args.queries_from!r}", file=sys.stderr)
        return 2
    try:
        built = beir.build_quora(args.data_dir, splits)
        beir.write(args.out, built.corpus, built.queries, built.qrels)
    except (DataError, WriteError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    relevant = sum(len(d) for d in built.qrels.values())
    print(f"{args.out}: {len(built.queries)} queries (duplicate pairs of {', '.join(splits)}), "
          f"{len(built.corpus)} documents, {relevant} relevant pairs")
    return 0
