"""bertcf.cli: checked flag types, renamed flags, and --resume's saved settings."""
from __future__ import annotations

import json

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
    def parser():
        p = cli.add_common_args(cli.ArgumentParser(prog="prog"))
        p.add_argument("--qqp-weight", type=float, default=20.0)
        return p

    (tmp_path / "config.json").write_text(json.dumps({"para_weight": 7.0, "steps": 30}))
    argv = ["--resume", "--out-dir", str(tmp_path), "--device", "cpu"]
    upgrade = lambda d: {("qqp_weight" if k == "para_weight" else k): v for k, v in d.items()}  # noqa: E731
    args = cli.parse_args(parser(), argv, upgrade=upgrade)
    assert (args.qqp_weight, args.steps) == (7.0, 30)
    args = cli.parse_args(parser(), argv)  # without it, the old key is no flag of the parser
    assert (args.qqp_weight, args.steps) == (20.0, 30)
