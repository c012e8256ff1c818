"""The directory of a search index (``store``): what a build may replace, how it replaces it, and
how a reader knows the files are the ones the build wrote.

- One build at a time: a build holds the directory as a training run holds its own (``IndexLock``,
  ``utils.lock``: another process is refused at once in one line naming the holder; a killed
  holder leaves nothing that stops the next). The lock file is beside the directory,
  ``.NAME.lock``, since the directory itself is replaced.
- Written whole (``replace``): into a temporary directory of the build's own beside it
  (``.NAME.build-PID-RANDOM``), then swapped into place in two renames, the previous index moved
  aside as ``.NAME.old`` in between (``utils.files.save_dir_atomic``, given that temporary
  directory). Only a directory that holds an index and nothing else is replaced (``check_target``): a
  file of the user's there would leave with the old directory.
- Recovered (``recover``): a kill between the two renames leaves no directory and the previous
  index whole in ``.NAME.old``; the next build or query puts it back (``utils.files.recover_dir``)
  and says so in one line. The next build removes what killed builds left beside it.
- Checked: index.json records the checksum (sha256) of every file beside it; a reader refuses a
  file whose bytes differ (``verify``), and tells a file a build swapped in while it read from a
  damaged one. An index from before the checksums is read unchecked.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from ..errors import DataError, UsageError, WriteError
from ..utils import lock
from ..utils.files import recover_dir, save_dir_atomic

FORMAT, VERSION = "bertcf-search-index", 1
META_FILE, INDEX_FILE, VECTORS_FILE = "index.json", "index.faiss", "vectors.npy"
RANGES_FILE, DOCUMENTS_FILE = "ranges.npy", "documents.jsonl"
INDEX_FILES = (META_FILE, INDEX_FILE, VECTORS_FILE, RANGES_FILE, DOCUMENTS_FILE)  # all a build writes
#: hashlib's name of the checksums index.json records. sha256 rather than blake2b: on CPUs with SHA
#: instructions (x86 since about 2017, ARMv8) hashlib's sha256 is the faster of the two (docs/search.md).
CHECKSUM = "sha256"
HASH_BLOCK = 1 << 22  # bytes read at a time to hash a file


def replace(directory, write) -> None:
    """Hold ``directory`` (``hold``), recover and check it (``prepare``), call ``write(tmp)`` in a
    new temporary directory of this build's own beside it, and swap the finished index into place
    (``utils.files.save_dir_atomic``, whose two renames ``recover`` undoes). A write that fails (or
    a Ctrl-C) removes the temporary directory and leaves the previous index as it was (a refused
    write: ``WriteError``)."""
    directory = index_dir(directory)
    with hold(directory):
        prepare(directory)
        # Its own name, not a fixed one: two builds never share a temporary directory, even where
        # the file system has no locks and ``hold`` could not keep the second out.
        save_dir_atomic(directory, write,
                        tmp=directory.with_name(f".{directory.name}.build-{os.getpid()}-{secrets.token_hex(4)}"))


def index_dir(directory) -> Path:
    """``directory`` as a path with a name (``.`` and ``..`` resolved): its lock, its temporary
    directories and its old copy are named after it, beside it."""
    directory = Path(directory)
    if directory.name in ("", ".", ".."):
        directory = directory.resolve()
    if not directory.name:
        raise UsageError(f"{directory} cannot be an index directory; give a directory below it")
    return directory


def aside(directory: Path) -> Path:
    """Where the swap moves the previous index for a moment (``utils.files.recover_dir``'s name)."""
    return directory.with_name(f".{directory.name}.old")


class IndexLock(lock.DirLock):
    """The lock of an index directory (``utils.lock``, as a training run's: one process at a time,
    another refused at once in one line naming the holder, nothing stale after a kill). Its file is
    beside the directory, ``.NAME.lock``, not in it: a build replaces the directory whole, and a lock
    file inside would leave with the previous index, letting a second build in."""

    def __init__(self, directory, hint: str = "wait for that build to end, or choose another --out"):
        super().__init__(index_dir(directory), hint)
        self.path = self.dir.with_name(f".{self.dir.name}.lock")

    def _make_dir(self) -> None:
        """The parent only: the index directory is the one the build's swap puts there."""
        if self.dir.exists() and not self.dir.is_dir():
            raise UsageError(f"--out {self.dir} is a file, not a directory; give a new or empty directory, or an index")
        missing = [p for p in self.dir.parents if not p.exists()]
        try:
            self.dir.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise WriteError(f"cannot create {self.dir.parent}: {e.strerror or e}") from None
        self.created = self.created or missing


@contextmanager
def hold(directory, hint: str | None = None):
    """The index directory held by this process for the block (``IndexLock``); a process that holds
    it already goes on holding it (the command holds it across the model's loading, ``build`` then
    takes it again)."""
    directory = index_dir(directory)
    if lock.held(directory):
        yield
        return
    with IndexLock(directory, **({"hint": hint} if hint else {})):
        yield


def prepare(directory) -> None:
    """Before a build, holding the directory: an interrupted replacement recovered (``recover``),
    what killed builds left beside it removed, and a directory that holds anything else refused
    (``check_target``)."""
    directory = index_dir(directory)
    recover(directory)
    if lock.held(directory):  # no build can be running: what is there was left by killed ones
        stale = [p for p in directory.parent.iterdir()
                 if p.name.startswith(f".{directory.name}.build-") or p.name == f".{directory.name}.tmp"
                 or (p == aside(directory) and directory.exists())]  # .tmp: where builds used to write
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
    check_target(directory)


def recover(directory) -> bool:
    """After a build killed between the two renames of ``save_dir_atomic``: no directory, and the previous index
    whole in ``.NAME.old``. It comes back (``utils.files.recover_dir``, as a run's last/ does), said
    in one line on stderr; True when it did. A query does this too, holding the directory meanwhile
    (refused while a build holds it: that build is between its renames now)."""
    directory = index_dir(directory)
    if directory.exists() or not aside(directory).is_dir():
        return False
    try:
        with hold(directory, hint="a build is replacing the index now; run the command again when it has ended"):
            if directory.exists() or not aside(directory).is_dir():  # another process put it back meanwhile
                return False
            recover_dir(directory)
    except OSError as e:  # e.g. a query by a user who may not write there
        raise DataError(f"{directory}: a build was interrupted while it replaced the index, whose previous version is "
                        f"whole in {aside(directory)}; it cannot be put back ({e.strerror or e}): rename it to "
                        f"{directory.name}") from None
    print(f"note: {directory}: a build was interrupted while it replaced the index; the previous index is back "
          f"in place", file=sys.stderr)
    return True


def check_target(directory) -> None:
    """Refuse an ``--out`` that holds anything a build did not write: a build replaces the directory
    whole, so a file of the user's there would be lost with it. A new or empty directory, or one
    holding an index and nothing else, is taken."""
    directory = Path(directory)
    if directory.is_file():
        raise UsageError(f"--out {directory} is a file, not a directory; give a new or empty directory, or an index")
    if not directory.is_dir():
        return
    entries = sorted(directory.iterdir())
    foreign = [p.name for p in entries if p.name not in INDEX_FILES or not p.is_file()]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UsageError(f"--out {directory} holds {shown}, which a build did not write, and a build replaces the "
                         f"whole directory: move {'it' if len(foreign) == 1 else 'them'} out, or give a new or "
                         f"empty directory")
    if entries and not _is_meta(directory / META_FILE):
        raise UsageError(f"--out {directory} exists and is not a search index (it has files of an index's names but "
                         f"no {META_FILE} of one); give a new or empty directory")


def _is_meta(path: Path) -> bool:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def file_checksum(path, algorithm: str = CHECKSUM) -> str:
    """The hex digest of a file's bytes, read a block at a time."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def verify(directory, name: str, meta: dict, digest: str | None = None) -> None:
    """Refuse a file of the index whose bytes are not those its build recorded (index.json's
    checksums): changed in place, damaged, or another build's (``digest``: its checksum, when the
    caller hashed it as it read it). An index built before the checksums were recorded is not checked."""
    directory = Path(directory)
    expected = (meta.get("checksums") or {}).get("files", {}).get(name)
    if expected is None:
        return
    if digest is None:
        try:
            digest = file_checksum(directory / name, meta["checksums"]["algorithm"])
        except OSError as e:
            raise DataError(f"{directory / name} cannot be read ({e.strerror or type(e).__name__}); build the index "
                            f"again") from None
    if digest == expected:
        return
    if _replaced(directory, meta):
        raise DataError(f"{directory} was replaced by a build while this command read it; run the command again")
    raise DataError(f"{directory / name} does not match the checksum its {META_FILE} records (its bytes changed "
                    f"since the index was built: edited, damaged or copied in from another index); build the index "
                    f"again")


def _replaced(directory: Path, meta: dict) -> bool:
    """Whether index.json is no longer the one ``meta`` was read from (a build swapped in another)."""
    try:
        return json.loads((directory / META_FILE).read_text(encoding="utf-8")) != meta
    except (OSError, ValueError, UnicodeDecodeError):
        return True
