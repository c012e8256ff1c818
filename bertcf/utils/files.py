"""Writing files so that a crash or a kill at any moment leaves the old complete file (or
directory) or the new one, never half of one: every writer of the project goes through here.
The temporary name is opened like any new file, so the result gets the umask's mode. A write
that fails for want of space, quota or permission removes its temporary copy and raises
``errors.WriteError``: one line naming what was being written and why."""
from __future__ import annotations

import errno
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from ..errors import WriteError


def default_file_mode() -> int:
    """The mode ``open()`` gives a new file (0o666 less the umask). minbert has its own copy: it knows
    nothing of bertcf, and this module must not import torch (the downloader runs before torch is
    installed)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask

#: The errors of a write that the machine refused (not a bug of ours): errno -> what a user reads.
REFUSED = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
           errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
           errno.EPERM: "operation not permitted"}
#: torch.save reports a failed write as a RuntimeError from its zip writer, without the errno.
TORCH_WRITE_FAILED = ("PytorchStreamWriter failed writing", "unexpected pos", "file write failed")


def refused_write(error: BaseException) -> str | None:
    """Why the machine refused a write (``REFUSED``), or None for any other error. torch.save's
    RuntimeError carries no errno; a full disk is then named only when the disk is in fact full."""
    if isinstance(error, OSError) and error.errno in REFUSED:
        return REFUSED[error.errno]
    if isinstance(error, RuntimeError) and any(s in str(error) for s in TORCH_WRITE_FAILED):
        return f"torch.save could not write ({' '.join(str(error).split())[:80]}; is the disk full?)"
    return None


def size_mb(path: Path) -> float:
    """The size of a file or directory tree in MB (0 where it does not exist)."""
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6 if path.is_dir() else 0.0


def write_error(target: Path, error: BaseException, reason: str) -> WriteError:
    """The one-line error of a refused write of ``target``; the size of its previous version, when
    there is one, says about how much room the new one needs."""
    needed = size_mb(target)
    room = f" (about {needed:.0f} MB needed)" if needed >= 1 else ""
    kept = ("the previous checkpoint is intact" if target.is_dir() else "the previous version is intact"
            if target.exists() else "no earlier file or checkpoint was changed")
    return WriteError(f"{reason} while writing {target}{room}; {kept}")


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` to write; when the block ends without an error it
    gets the mode ``open()`` would give and replaces ``path`` in one rename, otherwise it is
    removed and ``path`` is left as it was (a refused write: ``WriteError``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        reason = refused_write(e)
        if reason is None:
            raise
        raise write_error(path, e, reason) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def save_tensors_atomic(path, tensors: dict, metadata: dict | None = None) -> None:
    """A safetensors file of CPU tensors, written atomically with the umask's mode."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)


def write_json_atomic(path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def save_dir_atomic(target, write, tmp=None) -> None:
    """Call ``write(tmp_dir)``, then swap the finished directory into place, so a crash or
    kill at any moment leaves either the old complete checkpoint or the new one. A write that
    fails removes the temporary directory (a refused one: ``WriteError``). ``tmp``: the temporary
    directory, beside ``target`` (default ``.NAME.tmp``; a writer that others may race gives one
    of its own)."""
    target = Path(target)
    tmp = Path(tmp) if tmp is not None else target.with_name(f".{target.name}.tmp")
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = refused_write(e)
        if reason is None:
            raise
        raise write_error(target, e, reason) from None
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(target) -> Path:
    """If a kill fell between the two renames of save_dir_atomic, the old copy is complete."""
    target = Path(target)
    old = target.with_name(f".{target.name}.old")
    if not target.exists() and old.exists():
        os.replace(old, target)
    return target
