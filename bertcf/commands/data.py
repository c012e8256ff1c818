"""``python -m bertcf.data COMMAND``: ``download`` (the CS224N files, Wiki1M and SentEval's data,
verified; ``bertcf.data.download``), ``beir-quora`` (a BEIR-layout retrieval set from the CS224N
Quora files; ``bertcf.data.beir``), ``mine-negatives`` (hard negatives for (query, positive)
pairs; ``bertcf.data.negatives``) and ``genq`` (queries a seq2seq generator writes for a corpus's
passages, in BEIR's layout; ``bertcf.data.genq``). The first two import no torch, so the
downloader runs on a fresh machine."""
from __future__ import annotations

from pathlib import Path

from ..cli import ArgumentParser, run_main
from ..data import beir, download
from ..errors import DataError, UsageError


class DownloadFailed(DataError):
    """A file that could not be fetched or is not valid: exit status 1, as the downloader has
    always ended, where bad input is 2."""

    exit_status = 1


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m bertcf.data", description="BERT-CF data tools (see data/README.md).")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    add_download(commands)
    add_beir_quora(commands)
    add_mine_negatives(commands)
    add_genq(commands)
    return parser


def run(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    return args.run(args)


def main(argv: list[str] | None = None) -> int:
    """The exit status: 0, 1 when a download failed, 2 for bad input (one line on stderr)."""
    return run_main(run, argv)


def add_download(commands) -> None:
    """``download``: the subcommand of ``python -m bertcf.data``."""
    get = commands.add_parser(
        "download", help="download and verify the CS224N task files and Wiki1M",
        description="Download the CS224N task files and/or Wiki1M into --out, verifying "
                    "checksums; files already present and valid are skipped.")
    get.add_argument("--out", default="data", help="directory to put the files in")
    get.add_argument("--only", choices=sorted(download.SOURCES), help="download only this dataset")
    get.add_argument("--senteval", action="store_true",
                     help="download SentEval's evaluation data (SimCSE's senteval.tar) into OUT/SentEval instead")
    get.add_argument("--timeout", type=float, default=60.0, help="network timeout in seconds for each connect/read")
    get.add_argument("--base-url", default=download.data_url(),
                     help=f"fetch every file from BASE_URL/<name> (a mirror; ${download.DATA_URL_ENV} sets it)")
    get.add_argument("--no-progress", action="store_true", help="no progress (else a bar on a terminal, plain lines in "
                                                                   "a log file)")
    get.set_defaults(run=run_download)


def run_download(args) -> dict:
    """The ``download`` subcommand: a file not fetched or not valid ends it with status 1 (``DownloadFailed``)."""
    if args.senteval:
        if args.only:
            raise UsageError("--senteval and --only exclude each other")
        try:
            download.download_senteval(args.out, timeout=args.timeout, base_url=args.base_url,
                                       progress=not args.no_progress)
        except DataError as error:
            raise DownloadFailed(str(error)) from None
        return {}
    try:
        results = download.download(args.out, args.only, timeout=args.timeout, base_url=args.base_url,
                                    progress=not args.no_progress)
    except DataError as error:
        raise DownloadFailed(str(error)) from None
    failed = [name for name, problem in results.items() if problem is not None]
    if failed:
        raise DownloadFailed(f"{len(failed)} of {len(results)} files failed: {', '.join(failed)}")
    print(f"{args.out}: all {len(results)} requested file(s) are valid")
    return {"files": len(results)}


def add_beir_quora(commands) -> None:
    """``beir-quora``: the subcommand of ``python -m bertcf.data``."""
    p = commands.add_parser(
        "beir-quora", help="build a BEIR-layout duplicate-question retrieval set from the CS224N Quora files",
        description="Queries: the first question of each duplicate pair of --queries-from; relevant: its "
                    "duplicate; corpus: every distinct question of the Quora files in --data-dir (as BEIR's "
                    "Quora task). Writes OUT/corpus.jsonl, OUT/queries.jsonl and OUT/qrels/test.tsv.")
    p.add_argument("--data-dir", default="data", help="directory with the CS224N files")
    p.add_argument("--out", required=True, help="directory to write the set to (replaced as a whole)")
    p.add_argument("--queries-from", default="dev",
                   help="comma-separated labelled splits whose duplicate pairs make the queries: train, dev "
                        "(the multitask stage trains on quora-train)")
    p.add_argument("--exclude-questions-of", default="",
                   help="comma-separated splits (dev): leave out every pair with a question of their duplicate pairs, "
                        "so that a set to train on shares no query or relevant document with the set built from them")
    p.add_argument("--split", default="test", choices=("test", "train", "dev"),
                   help="the qrels file to write, OUT/qrels/SPLIT.tsv (test: what the evaluation reads; "
                        "train: what --method simcse-sup and python -m bertcf.gpl --queries train on)")
    p.set_defaults(run=run_beir_quora)


def run_beir_quora(args) -> dict:
    splits = tuple(s.strip() for s in args.queries_from.split(",") if s.strip())
    bad = [s for s in splits if s not in ("train", "dev")]
    if bad or not splits:
        raise UsageError(f"--queries-from takes train and/or dev, not {args.queries_from!r}")
    exclude = tuple(s.strip() for s in args.exclude_questions_of.split(",") if s.strip())
    if set(exclude) - {"train", "dev"} or set(exclude) & set(splits):
        raise UsageError(f"--exclude-questions-of takes train and/or dev, not those of --queries-from: "
                         f"{args.exclude_questions_of!r}")
    built = beir.build_quora(args.data_dir, splits, exclude)
    beir.write(args.out, built.corpus, built.queries, built.qrels, split=args.split)
    relevant = sum(len(d) for d in built.qrels.values())
    print(f"{args.out}: {len(built.queries)} queries (duplicate pairs of {', '.join(splits)}), "
          f"{len(built.corpus)} documents, {relevant} relevant pairs (qrels/{args.split}.tsv)")
    return {"queries": len(built.queries), "documents": len(built.corpus), "relevant": relevant}


def add_mine_negatives(commands) -> None:
    """``mine-negatives``: the subcommand of ``python -m bertcf.data``."""
    from ..config.datatools import MiningSettings

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
    p.add_argument("--split", choices=("train", "dev", "test"), default="train",
                   help="--beir: the qrels whose (query, relevant document) pairs are mined for (qrels/SPLIT.tsv; "
                        "train, so that no evaluation judgement becomes training data)")
    p.add_argument("--corpus", help="more candidates, one a line (default: the positives, and a BEIR set's corpus)")
    p.add_argument("--out", required=True, help="the triplets file to write (anchor, positive, negative)")
    MiningSettings.add_arguments(p)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress (else a bar on a terminal, plain lines in a "
                                                                 "log file)")
    p.set_defaults(run=run_mine_negatives)


def run_mine_negatives(args) -> dict:
    """The ``mine-negatives`` subcommand: read the pairs, encode, mine, write."""
    from ..config.datatools import MiningSettings
    from ..data import negatives  # torch: not for the downloader
    from ..data.reading import read_lines
    from ..models.encoder import SentenceEncoder
    from ..utils.precision import resolve_device

    settings = MiningSettings(**MiningSettings.pick(args))
    if args.pairs:
        queries, positives = negatives.read_query_pairs(args.pairs)
        corpus = []
    elif args.nli:
        queries, positives = negatives.nli_pairs(args.nli)
        corpus = []
    else:
        queries, positives, corpus = negatives.beir_pairs(args.beir, args.split)
    if args.corpus:
        corpus += [line.strip() for line in read_lines(Path(args.corpus), "corpus file") if line.strip()]
    encoder = SentenceEncoder.from_pretrained(args.encoder).to(resolve_device(args.device))
    made = negatives.mine_and_write(args.out, encoder, queries, positives, corpus, settings.mining(),
                                    settings.encode_batch_size, not args.no_progress)
    print(f"{args.out}: {made['rows']} (anchor, positive, negative) rows for {made['pairs']} pairs "
          f"({made['rows'] / max(made['pairs'], 1):.2f} negatives a pair; asked {settings.num_negatives})")
    return made


def add_genq(commands) -> None:
    """``genq``: the subcommand of ``python -m bertcf.data``."""
    from ..config.datatools import GenQSettings

    p = commands.add_parser(
        "genq", help="write queries for a corpus's passages with a seq2seq query generator (GenQ), in BEIR's layout",
        description="GenQ (BEIR, Thakur et al. 2021): for each passage of --corpus, queries sampled from --generator "
                    "as BEIR's query generator samples them (nucleus sampling, top-p 0.95, top-k 25, 64 tokens); "
                    "writes OUT/corpus.jsonl, OUT/queries.jsonl and OUT/qrels/train.tsv, which run_pretrain.py "
                    "--stage supervised --method simcse-sup --negatives simcse --train-file OUT trains on (MNRL).")
    p.add_argument("--corpus", required=True, help="the passages: a set in BEIR's layout (its corpus.jsonl), a BEIR "
                                                   "corpus .jsonl, or a text file of one passage a line")
    p.add_argument("--out", required=True, help="the directory to write (replaced as a whole)")
    GenQSettings.add_arguments(p)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress (else a bar on a terminal, plain lines in a "
                                                                 "log file)")
    p.set_defaults(run=run_genq)


def run_genq(args) -> dict:
    """The ``genq`` subcommand: read the passages, load the generator, generate, write."""
    from ..config.datatools import GenQSettings
    from ..data import genq
    from ..utils.precision import resolve_device

    settings = GenQSettings(**GenQSettings.pick(args))
    made = genq.generate_set(args.corpus, args.out, settings.generator, settings.generation(),
                             resolve_device(args.device), not args.no_progress)
    print(f"{args.out}: {made['queries']} queries for {made['passages']} passages "
          f"({made['queries'] / made['passages']:.2f} a passage; {settings.queries_per_passage} drawn)")
    return made
