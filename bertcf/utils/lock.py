"""One process per directory: an exclusive lock on ``DIR/.lock`` (``fcntl.flock``) for as long as a
run, or the experiments runner, works in DIR.

The lock is the kernel's, not the file's: it goes when its holder's file descriptor closes, which
the kernel does for any process that ends, so a run killed with ``kill -9`` leaves no stale lock
(only, at worst, the file, which the next holder reuses). A process that finds the lock held is
refused at once (no waiting) with one line naming the directory and the holder, whose pid, host,
start time and command line the holder writes into the file. A clean release deletes the file,
and the directories that taking the lock created when they hold nothing else, so a command that
fails early leaves nothing behind.

Deleting a lock file is safe only together with a check on the taking side: a process may open
the file just before its holder deletes it, and then lock a file no longer in the directory. So
after taking the lock, ``acquire`` checks that the path still names the file it locked, and
starts again if not.
"""
from __future__ import annotations

import errno
import json
import os
import shlex
import socket
import sys
import time
import weakref
from datetime import datetime
from pathlib import Path

from ..errors import UsageError, WriteError

try:
    import fcntl
except ImportError:  # not a POSIX system: no locking (a note says so)
    fcntl = None

LOCK_FILE = ".lock"

#: The locks this process holds, by the directory's real path.
_HELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class DirectoryInUse(UsageError):
    """Another process holds the lock of the directory (one line: the directory and the holder)."""


def _key(directory) -> str:
    return os.path.realpath(directory)


def held(directory) -> bool:
    """Whether this process holds the lock of ``directory``."""
    lock = _HELD.get(_key(directory))
    return lock is not None and lock.fd is not None


def holder_info() -> dict:
    """What a holder writes into its lock file: who it is, for the message that refuses another."""
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now().isoformat(timespec="seconds"),
            "command": shlex.join(getattr(sys, "orig_argv", sys.argv))}


def describe(info: dict | None) -> str:
    """A holder, as the refusal names it."""
    if not info:
        return "a process that has not written its name yet"
    where = "" if info.get("host") in (None, socket.gethostname()) else f" on {info['host']}"
    command = " ".join(str(info.get("command")).split())  # one line, whatever the command (python -c "...")
    return f"pid {info.get('pid')}{where}, started {info.get('started')}: {command}"


class DirLock:
    """The lock of ``directory``: ``acquire()`` (creating the directory when needed) and
    ``release()``, or ``with DirLock(d):``. ``hint``: what the refusal advises."""

    def __init__(self, directory, hint: str = "wait for it to end, or choose another directory"):
        self.dir = Path(directory)
        self.path = self.dir / LOCK_FILE
        self.hint = hint
        self.fd: int | None = None
        self.created: list[Path] = []  # the directories acquire() made, deepest first

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> "DirLock":
        """Take the lock, or raise DirectoryInUse naming its holder (WriteError when the directory
        cannot be made)."""
        if fcntl is None:
            self._make_dir()
            print(f"note: no file locking on this system: nothing stops a second process in {self.dir}",
                  file=sys.stderr)
            return self
        while self.fd is None:
            self._make_dir()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):  # a file system without locks
                    os.close(fd)
                    print(f"note: cannot lock {self.path} ({e.strerror}): nothing stops a second process "
                          f"in {self.dir}", file=sys.stderr)
                    return self
                info = _read_info(fd)
                os.close(fd)
                self._remove_created()
                raise DirectoryInUse(f"{self.dir} is in use by another process ({describe(info)}); one run per "
                                     f"directory: {self.hint}") from None
            if _same_file(self.path, fd):
                self.fd = fd
            else:  # its holder deleted it after we opened it: take the lock again, on the file now there
                os.close(fd)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, (json.dumps(holder_info()) + "\n").encode(), 0)
        _HELD[_key(self.dir)] = self
        return self

    def release(self) -> None:
        """Delete the lock file (and the directories acquire() made, when empty), then let go."""
        if self.fd is None:
            return
        if _HELD.get(_key(self.dir)) is self:
            del _HELD[_key(self.dir)]
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self._remove_created()
        os.close(self.fd)
        self.fd = None

    def __del__(self):  # a lock never released (an object dropped after an error): the kernel's part goes
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def _make_dir(self) -> None:
        if self.dir.exists() and not self.dir.is_dir():
            raise UsageError(f"{self.dir} is a file, not a directory")
        missing = [p for p in (self.dir, *self.dir.parents) if not p.exists()]
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise WriteError(f"cannot create {self.dir}: {e.strerror or e}") from None
        self.created = self.created or missing

    def _remove_created(self) -> None:
        for d in self.created:
            try:
                d.rmdir()  # only an empty one
            except OSError:
                break
        self.created = []


def _same_file(path: Path, fd: int) -> bool:
    try:
        on_disk, ours = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (on_disk.st_dev, on_disk.st_ino) == (ours.st_dev, ours.st_ino)


def _read_info(fd: int, wait_s: float = 1.0) -> dict | None:
    """The holder's record in the lock file; it writes it just after taking the lock, so an empty
    or partial file is read again for up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = json.loads(os.pread(fd, 65536, 0).decode("utf-8", "replace"))
            if isinstance(info, dict):
                return info
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.05)
