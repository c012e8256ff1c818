"""The main job in one command: run_pretrain.py and run_multitask.py download the data they read
by default when it is missing (bertcf.data.download.fetch_missing), from a local HTTP server here
(BERTCF_DATA_URL, as a mirror would), and keep their one line, saying why, when they cannot."""
from __future__ import annotations

import contextlib
import hashlib
import io
import random
import shutil

import pytest
from helpers import multitask_argv as stage3_argv
from helpers import write_cs224n_files

from bertcf.commands import pretrain
from bertcf.multitask import command as multitask
from bertcf.cli import run_main
from bertcf.data import download
from bertcf.data.download import WIKI1M_NAME, Source
from bertcf.data.tasks import TASK_FILES

WORDS = "the a man woman dog cat band plays runs eats on in park street guitar piano red blue small big".split()
CORPUS_LINES = 24


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread


@pytest.fixture
def mirror(server, tmp_path, monkeypatch):
    """The local server as $BERTCF_DATA_URL, serving the nine CS224N files (tiny ones) and a
    24-line Wiki1M, with the downloader's checksums and line count made theirs."""
    root, base = server
    write_cs224n_files(root)
    rng = random.Random(0)
    (root / WIKI1M_NAME).write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 10)))
                                              for _ in range(CORPUS_LINES)) + "\n")
    sha = {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in TASK_FILES.values()}
    monkeypatch.setitem(download.SOURCES, "cs224n", tuple(Source(n, "unused", f"sha256:{h}") for n, h in sha.items()))
    monkeypatch.setitem(download.SOURCES, "wiki1m", (Source(WIKI1M_NAME, "unused", None, CORPUS_LINES),))
    monkeypatch.setenv(download.DATA_URL_ENV, base)
    return root


def test_fetch_missing_gets_only_what_is_missing(mirror, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "sts-dev.csv").write_text("not the served file\n")  # present: left as it is, though invalid
    names = ["sts-dev.csv", "sts-train.csv", WIKI1M_NAME, "not-a-known-file.txt"]
    assert download.fetch_missing(data, names) is None
    assert (data / "sts-dev.csv").read_text() == "not the served file\n"
    assert (data / "sts-train.csv").read_bytes() == (mirror / "sts-train.csv").read_bytes()
    assert (data / WIKI1M_NAME).read_bytes() == (mirror / WIKI1M_NAME).read_bytes()
    assert (data / f"{WIKI1M_NAME}.sha256").is_file()
    assert "sts-train.csv, wiki1m_for_simcse.txt not in" in capsys.readouterr().out
    assert download.fetch_missing(data, names) is None  # nothing missing: nothing asked, nothing said
    assert capsys.readouterr().out == ""


def test_fetch_missing_offline_says_why_and_leaves_nothing(tmp_path, monkeypatch):
    data = tmp_path / "new" / "data"
    why = download.fetch_missing(data, ["sts-dev.csv"])  # conftest's closed port: as offline
    assert why.startswith("the download failed: cannot download sts-dev.csv from 127.0.0.1:") and "\n" not in why
    assert not data.exists()
    monkeypatch.setenv(download.OFFLINE_ENV, "1")
    assert download.fetch_missing(data, ["sts-dev.csv"]) == "BERTCF_OFFLINE is set, so it was not downloaded"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv(download.OFFLINE_ENV)
    assert "no download under torchrun" in download.fetch_missing(data, ["sts-dev.csv"])


def pretrain_argv(bert_dir, data_dir, out) -> list[str]:
    """run_pretrain.py's main job, shrunk: no corpus or STS flag, the data directory's defaults."""
    return ["--model", str(bert_dir), "--data-dir", str(data_dir), "--out-dir", str(out), "--steps", "2",
            "--batch-size", "4", "--max-length", "16", "--eval-every", "2", "--device", "cpu", "--precision", "fp32",
            "--progress", "none"]


def multitask_argv(bert_dir, data_dir, out) -> list[str]:
    """run_multitask.py's run, shrunk: 2 steps, every training row, the default --lr and --log-every."""
    return stage3_argv(bert_dir, data_dir, out, 2, log_every=None, qqp_batch_size=4, proj_dim=8, max_length=16,
                       lr=None, max_train_examples=None, progress="none")


def test_pretraining_fetches_wiki1m_and_sts_dev(mirror, tiny_bert_dir, tmp_path):
    data, out = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_main(pretrain.run, pretrain_argv(tiny_bert_dir, data, out)) == 0
    assert sorted(p.name for p in data.iterdir()) == sorted(["sts-dev.csv", WIKI1M_NAME, f"{WIKI1M_NAME}.sha256"])
    assert (out / "best").is_dir()


def test_fine_tuning_fetches_the_task_files(mirror, tiny_bert_dir, tmp_path):
    data, out = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    shutil.copy(mirror / "sts-dev.csv", data)  # what is there stays; the rest comes
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_main(multitask.run, multitask_argv(tiny_bert_dir, data, out)) == 0
    assert sorted(p.name for p in data.iterdir()) == sorted(TASK_FILES.values())
    assert len(list((out / "predictions").iterdir())) == 6  # the test files came too


def test_only_the_test_files_missing_asks_nothing(mirror, tiny_bert_dir, tmp_path, monkeypatch):
    """A data directory with its train and dev files (cs224n-offline has no QQP test file) runs as
    before: no download is tried."""
    data = write_cs224n_files(tmp_path / "data")
    (data / "quora-test-student.csv").unlink()
    monkeypatch.setattr(download, "download", lambda *a, **k: pytest.fail("nothing should be downloaded"))
    from bertcf.multitask.config import parse
    from bertcf.multitask.data import fetch_data
    from bertcf.multitask.declarations import declared_tasks

    config = parse(multitask_argv(tiny_bert_dir, data, tmp_path / "run"))
    assert fetch_data(declared_tasks(config), config.data_dir) is None


@pytest.mark.parametrize("command", ["pretrain", "multitask"])
def test_offline_the_bare_command_keeps_its_one_line(command, tiny_bert_dir, tmp_path, capsys):
    """No server (conftest's closed port): the line that names the missing file and where it goes,
    saying that the download failed; exit 2, no run directory, no data directory left behind."""
    data, out = tmp_path / "data", tmp_path / "runs" / "run"
    argv = (pretrain_argv if command == "pretrain" else multitask_argv)(tiny_bert_dir, data, out)
    main = pretrain.run if command == "pretrain" else multitask.run
    assert run_main(main, argv) == 2
    captured = capsys.readouterr()
    assert "not in" in captured.out and "downloading" in captured.out  # what it tried, with the status lines
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err
    if command == "pretrain":
        assert err[0].startswith(f"error: no corpus: give --corpus FILE or --corpus-from-tasks ({data / WIKI1M_NAME} "
                                 f"not found; the download failed: cannot download {WIKI1M_NAME} from 127.0.0.1:")
    else:
        assert err[0].startswith(f"error: {data / 'ids-sst-train.csv'} not found (set --data-dir or --sst-train; the "
                                 f"download failed: cannot download ")
    assert "by hand" in err[0] and "data/README.md" in err[0]
    assert not data.exists() and not (tmp_path / "runs").exists()
