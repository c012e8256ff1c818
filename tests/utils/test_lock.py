"""One run per directory (bertcf.utils.lock, runs.hold): the lock file's mechanics, every command
refused with one line and exit status 2 while another process holds its directory (and nothing of
the holder's touched), and, in real processes, two runs into one directory, a SIGKILLed run that
resumes (no stale lock) and the experiments runner."""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import multitask_argv as stage3_argv
from helpers import write_cs224n_files

from bertcf import runs
from bertcf.commands import pretrain
from bertcf.multitask import command as multitask
from bertcf.cli import run_main
from bertcf.commands.experiments import main as experiments_cli
from bertcf.utils import lock
from bertcf.utils.lock import LOCK_FILE, DirectoryInUse, DirLock

REPO = Path(__file__).resolve().parents[2]
WORDS = "the a man woman dog cat band plays runs eats on in park street guitar piano red blue small big".split()


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread


# ---- the lock file -------------------------------------------------------------------------------
def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    d = tmp_path / "runs" / "a"
    first = DirLock(d).acquire()
    assert lock.held(d) and d.is_dir()
    info = json.loads((d / LOCK_FILE).read_text())
    assert info["pid"] == os.getpid() and info["command"] and info["started"]
    with pytest.raises(DirectoryInUse) as refused:  # flock: another open file is another holder, same process or not
        DirLock(d).acquire()
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{d} is in use by another process (pid {os.getpid()}, started")
    assert info["command"] in message
    assert (d / LOCK_FILE).is_file() and lock.held(d)  # the refusal changed nothing
    first.release()
    assert not lock.held(d) and not (tmp_path / "runs").exists()  # it made runs/ and runs/a: gone, being empty
    with DirLock(d):
        (d / "kept.txt").write_text("x")
    assert [p.name for p in d.iterdir()] == ["kept.txt"]  # the lock file goes; what the holder wrote stays


def test_a_lock_file_deleted_under_a_taker_is_taken_again(tmp_path, monkeypatch):
    """The holder deletes the file just after another process opened it: the taker's lock is on a
    file no longer there, so it takes the lock again on the file now there."""
    d = tmp_path / "run"
    d.mkdir()
    real_flock, calls = lock.fcntl.flock, {"n": 0}

    def flock_after_a_release(fd, op):
        calls["n"] += 1
        if calls["n"] == 1:  # as if the previous holder released (deleting the file) right now
            os.unlink(d / LOCK_FILE)
        return real_flock(fd, op)
    monkeypatch.setattr(lock.fcntl, "flock", flock_after_a_release)
    held = DirLock(d).acquire()
    assert calls["n"] == 2 and os.stat(d / LOCK_FILE).st_ino == os.fstat(held.fd).st_ino
    held.release()


def test_run_takes_the_lock_unless_its_command_holds_it(tmp_path):
    out = tmp_path / "run"
    run = runs.Run(out, {})
    assert lock.held(out)
    with pytest.raises(DirectoryInUse):
        runs.hold(out).__enter__()  # what a command started now would do
    run.close()
    assert not lock.held(out) and not (out / LOCK_FILE).exists()
    with runs.hold(out) as held:
        run = runs.Run(out, {}, resume=True)  # the command's lock: Run takes none of its own
        run.close()
        assert lock.held(out) and held.fd is not None
    assert not lock.held(out)


# ---- every command refused in one line while the directory is held ------------------------------------
def tree(d: Path) -> dict:
    """Every file under ``d``: its bytes and modification time."""
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The nine CS224N files, plus corpus.txt (16 sentences) for a tiny mirror run."""
    d = write_cs224n_files(tmp_path_factory.mktemp("lock-data"))
    rng = random.Random(0)
    (d / "corpus.txt").write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 10)))
                                            for _ in range(16)) + "\n")
    return d


def pretrain_argv(bert_dir, data_dir, out, steps=2, **flags) -> list[str]:
    settings = {"model": bert_dir, "data-dir": data_dir, "corpus": data_dir / "corpus.txt", "out-dir": out,
                "steps": steps, "batch-size": 4, "max-length": 16, "eval-every": 2, "device": "cpu",
                "precision": "fp32", "progress": "none"} | {k.replace("_", "-"): v for k, v in flags.items()}
    return [x for k, v in settings.items() for x in (f"--{k}", str(v))]


def multitask_argv(bert_dir, data_dir, out, steps=2) -> list[str]:
    """run_multitask.py's run, shrunk: every training row, the default --lr and --log-every."""
    return stage3_argv(bert_dir, data_dir, out, steps, log_every=None, qqp_batch_size=4, proj_dim=8, max_length=16,
                       lr=None, max_train_examples=None, progress="none")


def assert_refused(capsys, out: Path, status: int) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {out} is in use by another process (pid {os.getpid()}, started ")
    assert err[0].endswith("one run per directory: wait for it to end, or choose another --out-dir")


@pytest.mark.parametrize("command", ["pretrain", "pretrain --resume", "multitask", "multitask --resume",
                                     "multitask --predict-only", "experiments"])
def test_every_command_is_refused_while_another_holds_the_directory(command, tiny_bert_dir, data_dir, tmp_path,
                                                                    capsys):
    out = tmp_path / "run"
    main = multitask.run if command.startswith("multitask") else pretrain.run
    argv = (multitask_argv if command.startswith("multitask") else pretrain_argv)(tiny_bert_dir, data_dir, out)
    if command.endswith("--resume") or command.endswith("--predict-only"):
        with contextlib.redirect_stdout(io.StringIO()):
            main(argv)
        argv = (["--resume", "--out-dir", str(out), "--steps", "4"] if command.endswith("--resume")
                else ["--predict-only", "--checkpoint", str(out)])
    before = tree(out) if out.exists() else {}
    with DirLock(out):  # another process, as far as flock is concerned
        if command == "experiments":
            status = experiments_cli(["table1", "--out-dir", str(out), "--model", str(tiny_bert_dir),
                                      "--data-dir", str(data_dir), "--corpus", str(data_dir / "corpus.txt")])
        else:
            status = run_main(main, argv)
        assert_refused(capsys, out, status)
        assert {k: v for k, v in tree(out).items() if k != LOCK_FILE} == before  # nothing of the holder's touched
    assert not out.exists() or before


# ---- real processes ------------------------------------------------------------------------------
def start(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                env=os.environ | {"OMP_NUM_THREADS": "1"})


def wait_for(condition, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()[-3000:]}"
        assert time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def holder_pid(d: Path) -> int | None:
    try:
        return json.loads((d / LOCK_FILE).read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.slow
def test_two_runs_into_one_directory(tiny_bert_dir, data_dir, tmp_path):
    """A second run_pretrain.py, fresh or --resume, started while a first one runs in the same
    --out-dir: refused with one line naming the first's pid and command, exit 2, the first's files
    untouched; the first then finishes, its metrics.jsonl and config.json its own. The first is
    held still (SIGSTOP) while the second tries, so the window is not left to the scheduler."""
    out = tmp_path / "run"
    script = str(REPO / "run_pretrain.py")
    first = start([script, *pretrain_argv(tiny_bert_dir, data_dir, out, steps=40, eval_every=10, seed=1)],
                  tmp_path / "first.log")
    seconds = {}
    try:
        wait_for(lambda: (out / "last" / runs.STATE_FILE).is_file(), first, tmp_path / "first.log")
        first.send_signal(signal.SIGSTOP)
        before = tree(out)
        assert holder_pid(out) == first.pid
        attempts = {"fresh": pretrain_argv(tiny_bert_dir, data_dir, out, steps=40, eval_every=10, seed=2),
                    "resume": ["--resume", "--out-dir", str(out)]}
        for name, argv in attempts.items():  # side by side: most of each is starting Python
            seconds[name] = subprocess.Popen([sys.executable, script, *argv], cwd=REPO, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True)
        for name, second in seconds.items():
            lines = second.communicate(timeout=180)[0].strip().splitlines()
            assert second.returncode == 2 and len(lines) == 1, (name, lines)
            assert lines[0].startswith(f"error: {out} is in use by another process (pid {first.pid}, started ")
            assert "run_pretrain.py" in lines[0] and "--seed 1" in lines[0]
            assert tree(out) == before, name
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        for proc in (first, *seconds.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.communicate()
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 10, 20, 30, 40]
    assert json.loads((out / "config.json").read_text())["seed"] == 1
    assert not (out / LOCK_FILE).exists() and "Traceback" not in (tmp_path / "first.log").read_text()


@pytest.mark.slow
def test_a_killed_run_leaves_no_stale_lock(tiny_bert_dir, data_dir, tmp_path, capsys):
    """kill -9 leaves the lock file, not the lock: --resume goes on."""
    out = tmp_path / "run"
    log = tmp_path / "log"
    proc = start([str(REPO / "run_pretrain.py"), *pretrain_argv(tiny_bert_dir, data_dir, out, steps=100_000,
                                                               eval_every=100_000, save_every=5)], log)
    try:
        wait_for(lambda: (out / "last" / runs.STATE_FILE).is_file(), proc, log)
        proc.kill()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert holder_pid(out) == proc.pid  # the file is there, naming a process that is gone
    step = torch.load(out / "last" / runs.STATE_FILE, weights_only=False)["step"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_main(pretrain.run, ["--resume", "--out-dir", str(out), "--steps", str(step + 2)]) == 0
    assert torch.load(out / "last" / runs.STATE_FILE, weights_only=False)["step"] == step + 2
    assert not (out / LOCK_FILE).exists()


@pytest.mark.slow
def test_the_experiments_runner_is_refused_while_another_holds_out(tiny_bert_dir, data_dir, tmp_path):
    """Another process holds OUT: python -m bertcf.experiments stops in one line naming it, exit 2,
    OUT untouched."""
    out = tmp_path / "experiments"
    hold = ("import sys, time\nfrom bertcf.utils.lock import DirLock\n"
            "held = DirLock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree(out)
        done = subprocess.run([sys.executable, "-m", "bertcf.experiments", "table1", "--out-dir", str(out), "--model",
                               str(tiny_bert_dir), "--data-dir", str(data_dir), "--corpus",
                               str(data_dir / "corpus.txt"), "--steps-scale", "0.0002"],
                              cwd=REPO, capture_output=True, text=True, timeout=180)
    finally:
        holder.kill()
        holder.wait()
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {out} is in use by another process (pid {holder.pid}, started ")
    assert tree(out) == before
