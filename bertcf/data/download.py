"""Downloading the data: the CS224N task files, Wiki1M and SentEval's evaluation data, each
verified (sha256 or git blob id; a file without a known checksum has its sha256 recorded on
first download and checked afterwards) and written atomically.

Command line (also as ``python -m bertcf.data download``)::

    python -m bertcf.download download --out data/ [--only cs224n|wiki1m] [--timeout S]
    python -m bertcf.download download --senteval --out data/     (SentEval's files -> data/SentEval/)

The training commands call ``fetch_missing`` for the files they read from ``--data-dir`` by
default, so that a bare ``run_pretrain.py`` or ``run_multitask.py`` gets its data. A mirror (or a
test's local server) is named by ``BERTCF_DATA_URL`` (every file from ``URL/<name>``, as
``--base-url``); ``BERTCF_OFFLINE=1`` stops the commands from downloading at all.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..utils.files import write_text_atomic


class NetworkError(DataError):
    """The download server cannot be reached (no network, refused, timed out)."""


@dataclass(frozen=True)
class Source:
    """A file to download.

    ``checksum`` is ``"sha256:<hex>"`` or ``"git-blob:<hex>"`` (a git blob id: sha1 of
    ``b"blob <size>\\0" + bytes``), or None when none is known: then ``lines`` (if given)
    is checked, and the sha256 is recorded in ``<name>.sha256`` on first download and
    checked on later runs.
    """

    name: str
    url: str
    checksum: str | None = None
    lines: int | None = None


CS224N_REPO = "gpoesia/minbert-default-final-project"
CS224N_COMMIT = "7ac8260577fc12a86c7aaf38918056c30054ef39"
CS224N_BASE_URL = f"https://raw.githubusercontent.com/{CS224N_REPO}/{CS224N_COMMIT}/data/"

#: Checksums of the CS224N files at CS224N_COMMIT (data/README.md).
CS224N_CHECKSUMS: dict[str, str] = {
    "ids-sst-train.csv": "sha256:03b2b625c090f94a6afd59f114cde5282e2053aab0b101e87ed695d8a0c5b1df",
    "ids-sst-dev.csv": "sha256:a186ce94577635fbe10beaaddd50f16cccf6c30973221cefdf90deed2a584bfe",
    "ids-sst-test-student.csv":
        "sha256:bdd5a767faa0c26782117e37767ece154c30d5d04fb8727d09c71e3850a55c7b",
    "quora-train.csv": "git-blob:a3b5546f6a0e65b60a328a5d294d1038f5bed1da",
    "quora-dev.csv": "sha256:bfa3cc954a9ba300ae776a980141de65f622a3c1b97e3fd905d63245bc36d5ad",
    "quora-test-student.csv": "git-blob:f257ef00558555afb50819578a58205732b16354",
    "sts-train.csv": "sha256:15d12efc2d656fffb1d61ac1f08ec4227f43925fd16f420c037cbd063699c21b",
    "sts-dev.csv": "sha256:ce3cad6f16062586ac7ba462c28b010a9be10c530fd5074165860d7b7ab4e93d",
    "sts-test-student.csv":
        "sha256:dee455745b72e9ca3ff74e7c056bd73e34bad5b8d5641045a2c1e7e131866f47",
}

WIKI1M_NAME = "wiki1m_for_simcse.txt"
WIKI1M_URL = ("https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/"
              "resolve/main/wiki1m_for_simcse.txt")
WIKI1M_LINES = 1_000_000

#: What ``download`` fetches, by group name (``--only``).
SOURCES: dict[str, tuple[Source, ...]] = {
    "cs224n": tuple(Source(name, CS224N_BASE_URL + name, checksum)
                    for name, checksum in CS224N_CHECKSUMS.items()),
    "wiki1m": (Source(WIKI1M_NAME, WIKI1M_URL, None, WIKI1M_LINES),),
}

#: SentEval's evaluation data as SimCSE's users get it (SimCSE's SentEval/data/downstream/
#: download_dataset.sh): one tar of SentEval's data/downstream/ tree, unpacked into SENTEVAL_DIR.
SENTEVAL_SOURCE = Source("senteval.tar", "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/"
                                         "resolve/main/senteval.tar")
SENTEVAL_DIR = "SentEval"

DATA_URL_ENV = "BERTCF_DATA_URL"   # a mirror: every file from $BERTCF_DATA_URL/<name>
OFFLINE_ENV = "BERTCF_OFFLINE"     # set (to anything but "" or 0): the commands download nothing
#: The network timeout (seconds per connect or read) when a command fetches its data itself: a
#: machine whose network drops packets says so in this long, not the downloader's minute.
FETCH_TIMEOUT = 20.0

_CHUNK = 1 << 20


def file_checksum(path: str | os.PathLike, kind: str) -> str:
    """Hex digest of a file: ``kind`` is 'sha256' or 'git-blob' (git's blob id)."""
    path = Path(path)
    if kind == "sha256":
        digest = hashlib.sha256()
    elif kind == "git-blob":
        digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    else:
        raise ValueError(f"unknown checksum kind {kind!r} (expected 'sha256' or 'git-blob')")
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()



def _count_lines(path: Path) -> int:
    lines, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")  # a last line without a newline still counts


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _recorded_sha256(path: Path) -> str | None:
    try:
        return _record_path(path).read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError):
        return None


def verify_file(path: str | os.PathLike, source: Source,
                record_of: Path | None = None) -> str | None:
    """Check ``path`` against ``source``; return None when valid, else the reason.

    Without a checksum, the line count is checked and so is the sha256 recorded next to
    ``record_of`` (default: ``path``) on first download, when there is one.
    """
    path = Path(path)
    if not path.is_file():
        return "missing"
    if source.checksum is not None:
        kind, _, expected = source.checksum.partition(":")
        actual = file_checksum(path, kind)
        if actual != expected.lower():
            return f"{kind} mismatch (expected {expected}, got {actual})"
        return None
    if source.lines is not None:
        lines = _count_lines(path)
        if lines != source.lines:
            return f"has {lines:,} lines, expected {source.lines:,}"
    record = _record_path(record_of or path)
    recorded = _recorded_sha256(record_of or path)
    if recorded is not None:
        actual = file_checksum(path, "sha256")
        if actual != recorded:
            return (f"sha256 {actual} differs from the one recorded in {record} "
                    f"({recorded}); delete {record.name} to accept the new file")
    return None


def _fetch(url: str, target: Path, timeout: float, progress: bool) -> None:
    """Stream ``url`` into ``target``.  Raises HTTPError, NetworkError, OSError."""
    from ..utils.progress import Progress, mode_of

    request = urllib.request.Request(url, headers={"User-Agent": "bertcf-data/1.0"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            size = response.headers.get("Content-Length")
            with open(target, "wb") as out, Progress(
                mode_of(progress), target.name.removesuffix(".part"),
                int(size) if size and size.isdigit() else None, unit="B",
            ) as bar:
                received = 0
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            if size and size.isdigit() and received != int(size):
                raise OSError(f"incomplete download: got {received} of {size} bytes")
    except urllib.error.HTTPError:
        raise
    except urllib.error.URLError as error:
        raise NetworkError(_reason(error.reason)) from None
    except (TimeoutError, ConnectionError) as error:
        raise NetworkError(_reason(error)) from None


def _reason(reason: object) -> str:
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


def _download_one(source: Source, out_dir: Path, timeout: float, progress: bool) -> str | None:
    """Download one file atomically (``<name>.part`` then rename); None or the failure."""
    final = out_dir / source.name
    part = out_dir / (source.name + ".part")
    try:
        try:
            _fetch(source.url, part, timeout, progress)
        except urllib.error.HTTPError as error:
            return f"HTTP {error.code} {error.reason} for {source.url}"
        problem = verify_file(part, source, record_of=final)
        if problem is not None:
            return f"downloaded file is invalid: {problem}"
        os.replace(part, final)
    except http.client.HTTPException as error:
        return f"download interrupted ({error!r})"
    except OSError as error:
        return f"{error.strerror or error}" + (f": {error.filename}" if error.filename else "")
    finally:
        part.unlink(missing_ok=True)

    if source.checksum is not None:
        print(f"{source.name}: downloaded ({source.checksum.partition(':')[0]} ok)", flush=True)
        return None
    lines = f"{source.lines:,} lines, " if source.lines is not None else ""
    print(f"{source.name}: downloaded ({lines}{_ensure_record(final)})", flush=True)
    return None


def _ensure_record(path: Path) -> str:
    """Record the sha256 of ``path`` in ``<path>.sha256`` unless one is there; describe it."""
    sha256 = file_checksum(path, "sha256")
    record = _record_path(path)
    if _recorded_sha256(path) is not None:
        return f"sha256 {sha256} matches {record.name}"
    write_text_atomic(record, f"{sha256}  {path.name}\n")
    return f"sha256 {sha256}, recorded in {record.name}"


def download(out_dir: str | os.PathLike, only: str | None = None, *, timeout: float = 60.0,
             base_url: str | None = None, sources: Iterable[Source] | None = None,
             progress: bool = True) -> dict[str, str | None]:
    """Download the datasets into ``out_dir``; returns ``{file name: None or failure}``.

    ``only`` picks a group of :data:`SOURCES` ('cs224n' or 'wiki1m'; default all).
    ``sources`` replaces the file list, ``base_url`` fetches every file from
    ``<base_url>/<name>`` instead (a mirror, or a local server in tests).  Files already
    present and valid are kept; others are fetched to ``<name>.part``, verified and renamed,
    so an invalid or interrupted download never appears under the final name.  One status
    line per file is printed (failures on stderr).  Raises :class:`NetworkError` (one line,
    naming the files to place by hand) when the server cannot be reached.
    """
    if sources is None:
        if only is not None and only not in SOURCES:
            raise ValueError(f"unknown dataset {only!r} (expected one of {', '.join(SOURCES)})")
        groups = [only] if only else list(SOURCES)
        sources = [source for group in groups for source in SOURCES[group]]
    sources = list(sources)
    if base_url is not None:
        base = base_url.rstrip("/") + "/"
        sources = [Source(s.name, base + urllib.parse.quote(s.name), s.checksum, s.lines)
                   for s in sources]
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create {out_dir}: {error.strerror or error}") from None

    results: dict[str, str | None] = {}
    needed: list[Source] = []
    for source in sources:
        problem = verify_file(out_dir / source.name, source)
        if problem is None:
            note = "" if source.checksum else f"; {_ensure_record(out_dir / source.name)}"
            print(f"{source.name}: ok (already present{note})", flush=True)
            results[source.name] = None
        else:
            if problem != "missing":
                print(f"{source.name}: present but invalid ({problem}); downloading again",
                      flush=True)
            needed.append(source)

    for index, source in enumerate(needed):
        try:
            results[source.name] = _download_one(source, out_dir, timeout, progress)
        except NetworkError as error:
            host = urllib.parse.urlsplit(source.url).netloc or source.url
            names = ", ".join(s.name for s in needed[index:])
            raise NetworkError(
                f"cannot download {source.name} from {host} ({error}): without network, put "
                f"{names} into {out_dir}/ by hand (sources and file names: data/README.md)"
            ) from None
        if results[source.name] is not None:
            print(f"{source.name}: FAILED: {results[source.name]}", file=sys.stderr, flush=True)
    return results


def data_url() -> str | None:
    """The mirror that ``BERTCF_DATA_URL`` names, or None (each file's own source)."""
    return os.environ.get(DATA_URL_ENV) or None


def fetch_missing(data_dir: str | os.PathLike, names: Iterable[str], timeout: float = FETCH_TIMEOUT) -> str | None:
    """Download those of ``names`` (files of :data:`SOURCES`: the CS224N files, Wiki1M) that
    ``data_dir`` does not have, as a command does for the files it reads by default: verified and
    written atomically by :func:`download`, from ``$BERTCF_DATA_URL`` when set. Files that are
    present are not looked at (a directory of other files, such as ``cs224n-offline``, stays as it
    is), and nothing is asked of the network when none is missing.

    Returns None when every one of ``names`` is there afterwards, else why not, as a clause for the
    command's error line ("the download failed: ..."). A data directory this call created is removed
    again when the download leaves it empty."""
    data_dir = Path(data_dir)
    known = {s.name: s for group in SOURCES.values() for s in group}
    missing = [known[n] for n in dict.fromkeys(names) if n in known and not (data_dir / n).is_file()]
    if not missing:
        return None
    if os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
        return f"{OFFLINE_ENV} is set, so it was not downloaded"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every rank would fetch the same file at once
        return f"no download under torchrun: run python -m bertcf.data download --out {data_dir} first"
    created = not data_dir.exists()
    names_text = ", ".join(s.name for s in missing)
    # On stdout with the downloader's other status lines, so that a failure stays one line on stderr.
    print(f"{names_text} not in {data_dir}/: downloading (data/README.md)", flush=True)
    try:
        results = download(data_dir, sources=missing, timeout=timeout, base_url=data_url(),
                           progress=sys.stderr.isatty())
        failed = {name: problem for name, problem in results.items() if problem is not None}
        return "the download failed: " + "; ".join(f"{n}: {p}" for n, p in failed.items()) if failed else None
    except NetworkError as error:
        return f"the download failed: {error}"
    finally:
        if created and data_dir.is_dir() and not any(data_dir.iterdir()):
            data_dir.rmdir()


def download_senteval(out_dir: str | os.PathLike, *, timeout: float = 60.0, base_url: str | None = None,
                      progress: bool = True) -> Path:
    """Fetch SimCSE's ``senteval.tar`` into ``out_dir`` (sha256 recorded on first download, as
    for Wiki1M), and unpack it into ``out_dir/SentEval`` in the layout of SentEval's
    ``data/downstream/`` (STS/, SICK/, MR/, ...). The tree appears under its final name only once
    it is complete. Returns that directory; raises DataError (NetworkError offline)."""
    out_dir = Path(out_dir)
    target = out_dir / SENTEVAL_DIR
    if (target / "STS").is_dir():
        print(f"{target}: ok (already unpacked; delete it to unpack again)", flush=True)
        return target
    try:
        results = download(out_dir, sources=[SENTEVAL_SOURCE], timeout=timeout, base_url=base_url,
                           progress=progress)
    except NetworkError as error:
        raise NetworkError(f"{error}; or put the unpacked files (SentEval's data/downstream/: STS/, SICK/, MR/, "
                           f"...) into {target}/") from None
    if results[SENTEVAL_SOURCE.name] is not None:
        raise DataError(f"{SENTEVAL_SOURCE.name}: {results[SENTEVAL_SOURCE.name]}")
    archive = out_dir / SENTEVAL_SOURCE.name
    staging = out_dir / f".{SENTEVAL_DIR}.unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        root = next((d for d in [staging, *sorted(staging.rglob("*"))] if (d / "STS").is_dir()), None)
        if root is None:
            raise DataError(f"{archive} has no STS/ folder: not SentEval's data (delete it and download again)")
        os.replace(root, target)
    except (tarfile.TarError, EOFError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"{archive} is not a valid tar archive ({reason}); delete it and "
                        f"{_record_path(archive).name}, and download again") from None
    except OSError as error:
        raise DataError(f"cannot unpack {archive}: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"{target}: unpacked from {archive.name}", flush=True)
    return target
