"""``python -m bertcf.experiments`` and ``bertcf-experiments``: the report's experiments in one
command (``bertcf.experiments``: the plan, the runs, the tables and claims; its flags and the
settings an output directory keeps: ``bertcf.experiments.options``)."""
from __future__ import annotations

import sys

from .. import runs
from ..cli import run_main, stop_status
from ..experiments.execute import Interrupted
from ..experiments.options import parse_args
from ..experiments.plan import Plan
from ..experiments.suite import dry_run, run_suite


def run(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.dry_run:
        plan = Plan(args, argv)
        return dry_run(plan, plan.runs())
    # One runner per OUT, from before the plan reads what is on disk. The runs it starts (in this
    # process) lock their own directories, OUT/stages/<name> and OUT/finetune/<row>, not OUT.
    with runs.hold(args.out_dir):
        try:
            return run_suite(args, argv)
        except KeyboardInterrupt:  # between runs (a run's own Ctrl-C is Interrupted): the same hint
            raise Interrupted("Ctrl-C", "SIGINT") from None


def main(argv=None) -> int:
    try:
        return run_main(run, argv)
    except Interrupted as e:
        print(f"\ninterrupted: {e}; run the same command again to continue where it stopped", file=sys.stderr)
        return stop_status({"signal": e.signal or "SIGINT"})
