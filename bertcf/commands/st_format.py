"""``python -m bertcf.st_format upgrade DIR [DIR ...]``: checkpoints (or run directories: their
best/ and last/) with a flow written before 2026-11-24, given the flow module's code so that
sentence-transformers loads them without BERT-CF installed (``bertcf.models.st_format.upgrade``)."""
from __future__ import annotations

from pathlib import Path

from ..cli import ArgumentParser, run_main
from ..models.st_format import upgrade
from ..runs import is_run_dir


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m bertcf.st_format",
                            description="Upgrade checkpoints with a flow written before 2026-11-24 so that "
                                        "sentence-transformers loads them without BERT-CF installed.")
    parser.add_argument("command", choices=("upgrade",))
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="a checkpoint, or a run directory (its best/ and last/)")
    return parser


def run(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    changed = {}
    for d in map(Path, args.dirs):
        checkpoints = [d / n for n in ("best", "last") if (d / n).is_dir()] if is_run_dir(d) else [d]
        for checkpoint in checkpoints:
            changed[str(checkpoint)] = upgrade(checkpoint)
            print(f"{checkpoint}: {'upgraded' if changed[str(checkpoint)] else 'nothing to upgrade (no flow, or already done)'}")
    return changed


def main(argv=None) -> int:
    return run_main(run, argv)
