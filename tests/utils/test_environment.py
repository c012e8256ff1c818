"""Every run records what it ran with (bertcf.utils.environment): the record's fields against
importlib.metadata, torch and git themselves; git absent or no checkout gives None; a run's
environment.json, kept out of config.json; --resume on another environment warns in one line and
adds a session; the model card names the versions."""
from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import platform
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertcf import runs
from bertcf.commands import pretrain
from bertcf.cli import run_main
from bertcf.models.model_card import model_card
from bertcf.utils import environment

REPO = Path(__file__).resolve().parents[2]
WORDS = "the a man woman dog cat band plays runs eats on in park street guitar piano red blue small big".split()


def test_record_fields_are_the_installed_versions_and_this_process():
    record = environment.collect("cpu", "fp32")
    assert record["packages"] == {name: importlib.metadata.version(name) for name in environment.PACKAGES}
    assert set(record["packages"]) == {"torch", "transformers", "tokenizers", "sentence-transformers", "numpy",
                                       "scikit-learn"}
    assert record["python"] == platform.python_version()
    assert record["torch_threads"] == torch.get_num_threads()
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["device"] == "cpu" and record["precision"] == "fp32" and record["world_size"] == 1
    assert record["device_name"] == record["cpu_model"] == environment.cpu_model()
    assert record["command"].split()[0] == sys.orig_argv[0]  # the whole command line, as Python was started
    expected = {"python", "bertcf_version", "packages", "git_commit", "git_dirty", "device", "device_name",
                "precision", "torch_threads", "cpu_capability", "world_size", "cpu_model", "platform", "command"}
    assert set(record) == expected
    json.dumps(record)  # plain JSON


def test_cpu_model_is_proc_cpuinfo_s():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file() or "model name" not in cpuinfo.read_text():
        pytest.skip("no x86 /proc/cpuinfo here")
    lines = cpuinfo.read_text().splitlines()
    names = {line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")}
    assert environment.cpu_model() in names


def test_git_commit_is_the_checkout_s():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout, or no git")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert environment.git_state(REPO) == (head, status != "")


def test_git_absent_or_no_checkout_gives_none(tmp_path, monkeypatch):
    assert environment.git_state(tmp_path) == (None, None)  # not a repository
    if shutil.which("git"):  # a repository that contains the package but is not its checkout (a venv inside it)
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
        inner = tmp_path / "venv" / "site-packages"
        inner.mkdir(parents=True)
        assert environment.git_state(inner) == (None, None)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no git at all
    assert environment.git_state(REPO) == (None, None)
    record = environment.collect()
    assert record["git_commit"] is None and record["git_dirty"] is None

    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired("git", 10)
    monkeypatch.setattr(environment.subprocess, "run", hangs)
    assert environment.git_state(REPO) == (None, None)


def test_project_version_without_an_installed_distribution(monkeypatch):
    import tomllib

    monkeypatch.setattr(environment, "version", lambda name: None)
    assert environment.project_version() == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    monkeypatch.setattr(environment, "CHECKOUT", REPO / "nowhere")
    assert environment.project_version() is None


def test_differences_name_the_fields_but_not_command_or_time():
    old = {"packages": {"torch": "2.12.0", "numpy": "2.0"}, "cpu_capability": "AVX512", "command": "a", "started": 1}
    new = {"packages": {"torch": "2.13.0", "numpy": "2.0"}, "cpu_capability": "AVX2", "command": "b", "started": 2,
           "git_commit": "abc"}
    assert environment.differences(old, new) == [("cpu_capability", "AVX512", "AVX2"), ("git_commit", None, "abc"),
                                                  ("packages.torch", "2.12.0", "2.13.0")]
    assert environment.differences(new, new) == []


def test_model_card_names_the_versions():
    config = {"stage": "mirror", "method": "mirror", "model": "bert-base-uncased", "command": "python run_pretrain.py"}
    card = model_card(config, "sts_spearman", 0.5, 10)
    line = next(l for l in card.splitlines() if l.startswith("- Software: "))
    assert f"Python {platform.python_version()}" in line
    for name in environment.PACKAGES:
        assert f"{name} {importlib.metadata.version(name)}" in line
    assert "environment.json" in line


# ---- a run's record ------------------------------------------------------------------------------
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """sts-dev.csv (8 pairs) and corpus.txt (16 sentences) for a tiny mirror run."""
    d = tmp_path_factory.mktemp("env-data")
    rng = random.Random(0)

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 10)))
    rows = ["\tid\tsentence1\tsentence2\tsimilarity"] + [f"{i}\tid{i}\t{sentence()}\t{sentence()}\t{i % 5}.0"
                                                         for i in range(8)]
    (d / "sts-dev.csv").write_text("\n".join(rows) + "\n")
    (d / "corpus.txt").write_text("\n".join(sentence() for _ in range(16)) + "\n")
    return d


def pretrain_argv(bert_dir, data_dir, out, steps=2) -> list[str]:
    return ["--model", str(bert_dir), "--data-dir", str(data_dir), "--corpus", str(data_dir / "corpus.txt"),
            "--out-dir", str(out), "--steps", str(steps), "--batch-size", "4", "--max-length", "16",
            "--eval-every", "2", "--device", "cpu", "--precision", "fp32", "--progress", "none"]


def test_a_run_records_its_environment_and_a_resume_on_another_warns(tiny_bert_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        pretrain.run(pretrain_argv(tiny_bert_dir, data_dir, out))
    (first,) = json.loads((out / runs.ENVIRONMENT_FILE).read_text())["sessions"]
    assert first["session"] == "start" and first["device"] == "cpu" and first["precision"] == "fp32"
    assert first["packages"] == environment.package_versions()
    config = json.loads((out / "config.json").read_text())
    assert not set(config) & {"environment", "packages", "sessions", "cpu_capability"}  # never a setting
    card = (out / "best" / "README.md").read_text()
    assert f"torch {importlib.metadata.version('torch')}" in card
    capsys.readouterr()

    # The run "was" on another torch and CPU: the resume says so in one line, and keeps both records.
    # The faked values differ from this machine's whatever it is (its instruction set, its torch).
    # torch's version as recorded: its distribution's, which a CUDA build may give without the
    # "+cu130" that torch.__version__ has.
    now, torch_now = torch.backends.cpu.get_cpu_capability(), first["packages"]["torch"]
    other_capability = "AVX2" if now != "AVX2" else "AVX512"
    other_torch = "2.4.0" if torch_now != "2.4.0" else "2.5.0"
    faked = first | {"packages": first["packages"] | {"torch": other_torch}, "cpu_capability": other_capability,
                     "command": "python elsewhere"}
    (out / runs.ENVIRONMENT_FILE).write_text(json.dumps({"sessions": [faked]}))
    assert run_main(pretrain.run, ["--resume", "--out-dir", str(out), "--steps", "4"]) == 0
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    warnings = [l for l in err if l.startswith("warning:")]
    assert len(warnings) == 1, err
    assert warnings[0] == (f"warning: {out} ran with another environment until now: cpu_capability "
                           f"{other_capability} -> {now}, packages.torch {other_torch} -> {torch_now} "
                           f"(both in environment.json)")
    sessions = json.loads((out / runs.ENVIRONMENT_FILE).read_text())["sessions"]
    assert [s["session"] for s in sessions] == ["start", "resume"] and sessions[0] == faked
    resumed = json.loads((out / "config.json").read_text())
    assert not set(resumed) & {"environment", "packages", "sessions", "cpu_capability"}
    assert resumed["seed"] == config["seed"] and resumed["model"] == config["model"]  # the run's settings

    # The same environment again: no warning.
    assert run_main(pretrain.run, ["--resume", "--out-dir", str(out), "--steps", "6"]) == 0
    assert "warning:" not in capsys.readouterr().err
    assert len(json.loads((out / runs.ENVIRONMENT_FILE).read_text())["sessions"]) == 3
