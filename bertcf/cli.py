"""What every command line shares: the parser and its help format, checked flag types, old flag
names, parsing with --resume's saved settings, and how bad input ends a command: one line on
stderr and exit status 2. The settings themselves are declared in ``bertcf.config``."""
from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import sys
from pathlib import Path

from .errors import DataError, NonFiniteLossError, UsageError, WriteError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's formatter that shows each flag's default, "(default: X)", except where there is
    no value to show (None, "", a switch's False): their help says in words what happens."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == "":
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but --help shows the defaults (HelpFormatter), and a bad flag is one line on
    stderr (and exit status 2), not the usage text."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=kwargs.pop("formatter_class", HelpFormatter), **kwargs)

    def error(self, message):
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


# ---- checked flags: a type that also refuses bad values, beside the flag it guards ------------------
def checked(convert, good, what: str):
    """An argparse ``type``: ``convert`` the text, then refuse a value that fails ``good``; argparse
    reports it in one line ("argument --steps: must be at least 1, not 0") with exit status 2."""
    def parse(text):
        value = convert(text)
        if not good(value):
            raise argparse.ArgumentTypeError(f"must be {what}, not {text}")
        return value
    parse.__name__ = convert.__name__  # argparse names the type when the text does not convert
    parse.good, parse.what = good, what  # the same check on a value given from Python (bertcf.config)
    return parse


AT_LEAST_1 = checked(int, lambda v: v >= 1, "at least 1")
AT_LEAST_2 = checked(int, lambda v: v >= 2, "at least 2")
AT_LEAST_0 = checked(int, lambda v: v >= 0, "at least 0")
POSITIVE = checked(float, lambda v: 0 < v < math.inf, "positive")
NON_NEGATIVE = checked(float, lambda v: 0 <= v < math.inf, "a number >= 0")
PROBABILITY = checked(float, lambda v: 0 <= v < 1, "in [0, 1)")
TOP_P = checked(float, lambda v: 0 < v <= 1, "in (0, 1]")


def check_truncate_dim(k: int | None, width: int, what: str) -> None:
    """Refuse --truncate-dim ``k`` outside ``what``'s vectors (``width`` dimensions): one line, exit status 2."""
    if k is not None and not 1 <= k <= width:
        raise UsageError(f"--truncate-dim {k}: {what}'s vectors have {width} dimensions")


def comma_list(convert, good, what: str):
    """An argparse ``type`` for a comma-separated list ("384,256,128") -> a tuple of ``convert``ed
    items, refused in one line unless ``good(the tuple)``; a list given from Python is checked alike."""
    def items(text: str) -> tuple:
        try:
            return tuple(convert(t) for t in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text}") from None
    items.__name__ = f"comma-separated {convert.__name__}"
    return checked(items, lambda v: len(v) > 0 and good(tuple(v)), what)


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
        saved = saved_settings(args.out_dir)
        saved = upgrade(saved) if upgrade else saved
        known = {a.dest for a in parser._actions}
        parser.set_defaults(**{k: v for k, v in saved.items() if k in known})
        args = parser.parse_args(argv)
    return args


def saved_settings(out_dir) -> dict:
    """The settings a run in ``out_dir`` was started with (its config.json), which --resume
    continues with; a missing or unreadable file is one line."""
    config = Path(out_dir) / "config.json"
    if not config.is_file():
        raise UsageError(f"--resume: {config} not found")
    try:
        saved = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"--resume: {config} is not valid JSON ({e}); it is the run's settings, which "
                         f"--resume needs: restore it or start a new run") from None
    if not isinstance(saved, dict):
        raise UsageError(f"--resume: {config} holds no settings (a JSON object); restore it or start a new run")
    return saved


def given_flags(parser: argparse.ArgumentParser, argv=None) -> set[str]:
    """The settings (argparse dests) that ``argv`` gives on the command line, even at their
    default value, as opposed to those left to their defaults. ``argv`` has been parsed once
    already (no --help, no bad flag)."""
    not_given = object()
    dests = [a.dest for a in parser._actions if a.dest != "help"]
    defaults = {d: parser.get_default(d) for d in dests}
    parser.set_defaults(**dict.fromkeys(dests, not_given))
    try:
        parsed = parser.parse_args(argv)
    finally:
        parser.set_defaults(**defaults)
    return {d for d in dests if getattr(parsed, d, not_given) is not not_given}


def given_values(parser: argparse.ArgumentParser, argv) -> dict:
    """The settings ``argv`` gives (``given_flags``) with their values, parsed once by ``parser``:
    how a command that runs another's stage takes flags given to it as words (GPL's after ``--``,
    the experiments' ``--pretrain-args``) into the typed config it builds."""
    parsed = parser.parse_args(argv)
    return {name: getattr(parsed, name) for name in sorted(given_flags(parser, argv))}


def command_line(script: str, argv=None) -> str:
    """The command that runs ``script`` with ``argv`` (default: this process's arguments), as a
    shell line; config.json and the model card record it."""
    return shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])


def stop_status(result) -> int:
    """The exit status of a command that returned ``result``: 128 + the number of the signal that
    stopped its run (130 for Ctrl-C, 143 for SIGTERM: the shell's convention, so a batch scheduler
    sees the job was stopped, not finished), else 0."""
    name = result.get("signal") if isinstance(result, dict) else None
    return 128 + signal.Signals[name].value if name else 0


def bad_input_errors() -> tuple[type[Exception], ...]:
    """The errors that end a command with one line: minbert's CheckpointError among them once
    minbert is imported (a command that loads no model, as the downloader, runs without torch)."""
    errors = (UsageError, DataError, NonFiniteLossError, WriteError)
    checkpoint_error = getattr(sys.modules.get("minbert"), "CheckpointError", None)
    return errors + (checkpoint_error,) if checkpoint_error else errors


def run_main(main, argv=None) -> int:
    """Run an entry point: bad input is one line on stderr and exit status 2 (or the error's
    ``exit_status``), no traceback."""
    try:
        return stop_status(main(argv))
    except bad_input_errors() as e:  # evaluated once main has run: its imports are done
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "exit_status", 2)
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (or a second one inside it)
        print("interrupted", file=sys.stderr)
        return 130
