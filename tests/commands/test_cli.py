"""bertcf.cli: checked flag types, renamed flags, --resume's saved settings, and --help (every
command shows its defaults)."""
from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

import pytest

from bertcf import cli


def parse_one(flag_type, text):
    p = cli.ArgumentParser(prog="prog")
    p.add_argument("--x", type=flag_type)
    return p.parse_args(["--x", text]).x


@pytest.mark.parametrize("flag_type, good, bad", [
    (cli.AT_LEAST_1, ["1", "7"], ["0", "-3"]),
    (cli.AT_LEAST_0, ["0", "2"], ["-1"]),
    (cli.POSITIVE, ["1e-5", "3"], ["0", "-1", "inf", "nan"]),
    (cli.NON_NEGATIVE, ["0", "0.5"], ["-0.1", "inf", "nan"]),
    (cli.PROBABILITY, ["0", "0.999"], ["1", "-0.1", "nan"]),
])
def test_checked_types_keep_good_values_and_refuse_bad_ones_in_one_line(flag_type, good, bad, capsys):
    for text in good:
        assert parse_one(flag_type, text) == float(text)
    for text in bad:
        with pytest.raises(SystemExit) as e:
            parse_one(flag_type, text)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("prog: error: argument --x: must be ") and f"not {text}" in err
        assert len(err.splitlines()) == 1


def test_checked_type_names_the_type_of_text_that_does_not_convert(capsys):
    with pytest.raises(SystemExit):
        parse_one(cli.AT_LEAST_1, "2.5")
    assert "argument --x: invalid int value: '2.5'" in capsys.readouterr().err


def test_renamed_flag_sets_the_new_one_with_a_note_and_stays_out_of_help(capsys):
    p = cli.ArgumentParser(prog="prog")
    p.add_argument("--qqp-weight", type=cli.NON_NEGATIVE, default=20.0)
    cli.add_renamed_flags(p, {"--para-weight": "--qqp-weight"})
    assert p.parse_args([]).qqp_weight == 20.0
    assert p.parse_args(["--para-weight", "3"]).qqp_weight == 3.0
    assert "note: --para-weight is now --qqp-weight" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        p.parse_args(["--para-weight", "-1"])  # the new flag's check applies to the old name too
    assert "--para-weight" not in p.format_help()


def test_resume_takes_saved_settings_through_upgrade(tmp_path):
    from bertcf.config.train import TrainConfig

    def parser():
        p = cli.ArgumentParser(prog="prog")
        TrainConfig.add_arguments(p)
        p.add_argument("--qqp-weight", type=float, default=20.0)
        return p

    (tmp_path / "config.json").write_text(json.dumps({"para_weight": 7.0, "steps": 30}))
    argv = ["--resume", "--out-dir", str(tmp_path), "--device", "cpu"]
    upgrade = lambda d: {("qqp_weight" if k == "para_weight" else k): v for k, v in d.items()}  # noqa: E731
    args = cli.parse_args(parser(), argv, upgrade=upgrade)
    assert (args.qqp_weight, args.steps) == (7.0, 30)
    args = cli.parse_args(parser(), argv)  # without it, the old key is no flag of the parser
    assert (args.qqp_weight, args.steps) == (20.0, 30)


def test_resume_from_a_damaged_config_is_one_line(tmp_path, capsys):
    """A config.json that is not JSON (hand-edited, or a disk that lost it): one line, exit 2."""
    from bertcf.commands import pretrain

    (tmp_path / "config.json").write_text('{"steps": 3')
    assert cli.run_main(pretrain.run, ["--resume", "--out-dir", str(tmp_path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--resume: {tmp_path / 'config.json'} is not valid JSON" in err
    (tmp_path / "config.json").write_text("[1]")  # JSON, but no settings
    assert cli.run_main(pretrain.run, ["--resume", "--out-dir", str(tmp_path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "holds no settings (a JSON object)" in err


COMMANDS = ("config.pretrain", "multitask.config", "config.evaluate", "commands.bench", "commands.encode")


def flag_helps(module: str) -> dict:
    """--flag -> its help text as --help prints it (whitespace collapsed), for every shown flag."""
    parser = importlib.import_module(f"bertcf.{module}").build_parser()
    formatter = parser._get_formatter()
    return {a.option_strings[-1]: (a, " ".join(formatter._expand_help(a).split()) if a.help else None)
            for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS and a.dest != "help"}


@pytest.mark.parametrize("module", COMMANDS)
def test_help_shows_every_default_once(module):
    """A flag with a value as its default shows it, once; the others (None, a switch's False)
    say in words what happens, if anything."""
    for flag, (action, text) in flag_helps(module).items():
        if action.default is None or action.default is False:
            continue
        assert text is not None, f"{module} {flag} has no help, so --help hides its default"
        assert text.endswith(f"(default: {action.default})"), (flag, text)
        assert text.count("default") == 1, (flag, text)


def test_help_of_the_first_hour():
    """What issue 30 found missing or wrong in --help."""
    pretrain, multitask = flag_helps("config.pretrain"), flag_helps("multitask.config")
    for flag, default in (("--steps", "10000"), ("--batch-size", "16"), ("--eval-every", "250"),
                          ("--dropout", "0.1"), ("--temperature", "0.05")):
        assert pretrain[flag][1].endswith(f"(default: {default})"), flag
    assert pretrain["--lr"][1] == ("AdamW's learning rate (default, by --stage: 0.0001 mirror, 0.0003 joint, "
                                   "0.0003 flow, 2e-05 supervised, 0.0001 mix)")
    assert multitask["--lr"][1].endswith("(default: 1e-05)") and multitask["--steps"][1].endswith("(default: 5000)")
    assert "runs/multitask-<encoder>-<time>" in multitask["--out-dir"][1]
    assert "<stage>-<method>" not in multitask["--out-dir"][1]
    assert flag_helps("config.evaluate")["--mode"][1].endswith("(default: test)")


def test_docs_list_every_bench_flag():
    """docs/benchmark.md, the bench command's page, lists every flag of it in backticks under "The flags"."""
    page = (Path(__file__).parents[2] / "docs" / "benchmark.md").read_text()
    section = page[page.index("\n## The flags"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    listed = set(re.findall(r"`(--[a-z-]+)", section))
    assert set(flag_helps("commands.bench")) <= listed, set(flag_helps("commands.bench")) - listed
