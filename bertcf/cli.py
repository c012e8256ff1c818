"""The command line every entry point shares: the common flags, parsing (with --resume's saved
settings), and how bad input ends a command: one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from .errors import NonFiniteLossError, UsageError
from .precision import resolve_device, resolve_precision


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (and exit status 2), not the usage text."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def add_common_args(parser: argparse.ArgumentParser, **defaults) -> argparse.ArgumentParser:
    """The flags of every training command (README, "The main job"), with the command's defaults."""
    d = dict(model="bert-base-uncased", steps=10_000, batch_size=16, lr=1e-4, eval_every=250,
             max_length=32, log_every=10) | defaults
    g = parser.add_argument_group("common")
    g.add_argument("--model", default=d["model"], help="Hugging Face BERT name or directory (default %(default)s)")
    g.add_argument("--init", default=None, help="start from this run directory or checkpoint instead of --model")
    g.add_argument("--data-dir", default="data", help="directory with the CS224N files (default %(default)s)")
    g.add_argument("--out-dir", default=None, help="run directory (default runs/<stage>-<method>-<time>)")
    g.add_argument("--steps", type=int, default=d["steps"])
    g.add_argument("--batch-size", type=int, default=d["batch_size"], help="global batch size")
    g.add_argument("--lr", type=float, default=d["lr"])
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--warmup-steps", type=int, default=0)
    g.add_argument("--lr-schedule", choices=("constant", "linear"), default="constant",
                   help="constant (the CS224N starter's) or linear decay to 0 after warm-up")
    g.add_argument("--max-grad-norm", type=float, default=0.0, help="clip gradients to this norm (0: off)")
    g.add_argument("--eval-every", type=int, default=d["eval_every"])
    g.add_argument("--log-every", type=int, default=d["log_every"], help="steps between logged training scalars")
    g.add_argument("--max-length", type=int, default=d["max_length"], help="tokens per sentence after truncation")
    g.add_argument("--seed", type=int, default=11711)
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    g.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default=None,
                   help="autocast precision (default: bf16 on a GPU that supports it, else fp32)")
    g.add_argument("--compile", action="store_true", help="wrap the encoder with torch.compile")
    g.add_argument("--resume", action="store_true", help="continue the run in --out-dir from its last/ checkpoint")
    return parser


def add_renamed_flags(parser: argparse.ArgumentParser, renames: dict) -> None:
    """Accept each old flag of ``renames`` (old -> new) as the new one, with a note on stderr,
    so that commands written before a rename still run; --help shows the new names only."""
    class Renamed(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(f"note: {option_string} is now {renames[option_string]}", file=sys.stderr)
            setattr(namespace, self.dest, values)

    for old, new in renames.items():
        target = next(a for a in parser._actions if new in a.option_strings)
        parser.add_argument(old, dest=target.dest, type=target.type, action=Renamed,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def parse_args(parser: argparse.ArgumentParser, argv=None, upgrade=None) -> argparse.Namespace:
    """Parse flags; with --resume, settings not given on the command line come from the
    run's config.json, so a resumed run continues with the settings it started with
    (``upgrade``: applied to the saved settings, for names that changed since)."""
    args = parser.parse_args(argv)
    if args.resume:
        if not args.out_dir:
            raise UsageError("--resume needs --out-dir (the run directory to continue)")
        config = Path(args.out_dir) / "config.json"
        if not config.is_file():
            raise UsageError(f"--resume: {config} not found")
        saved = json.loads(config.read_text())
        saved = upgrade(saved) if upgrade else saved
        known = {a.dest for a in parser._actions}
        parser.set_defaults(**{k: v for k, v in saved.items() if k in known})
        args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "eval_every", "max_length", "log_every"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.lr is not None and not args.lr > 0:
        raise UsageError(f"--lr must be positive, not {args.lr}")
    args.device = str(resolve_device(args.device))
    args.precision = resolve_precision(args.precision, args.device)
    return args


def command_line(script: str, argv=None) -> str:
    """The command that runs ``script`` with ``argv`` (default: this process's arguments), as a
    shell line; config.json and the model card record it."""
    return shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])


def run_main(main, argv=None) -> int:
    """Run an entry point: bad input is one line on stderr and exit status 2, no traceback."""
    from minbert import CheckpointError

    from .data import DataError
    try:
        main(argv)
        return 0
    except (UsageError, DataError, CheckpointError, NonFiniteLossError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (or a second one inside it)
        print("interrupted", file=sys.stderr)
        return 130

