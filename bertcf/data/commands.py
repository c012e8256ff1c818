"""``python -m bertcf.data COMMAND``: ``download`` (the CS224N files, Wiki1M and SentEval's data,
verified; ``bertcf.data.download``) and ``beir-quora`` (a BEIR-layout retrieval set from the CS224N
Quora files; ``bertcf.data.beir``). Neither imports torch, so the downloader runs on a fresh machine."""
from __future__ import annotations

import argparse

from . import beir, download


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bertcf.data",
                                     description="BERT-CF data tools (see data/README.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    download.add_command(commands)
    beir.add_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
