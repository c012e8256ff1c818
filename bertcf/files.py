"""Writing files so that a crash or a kill at any moment leaves the old complete file (or
directory) or the new one, never half of one: every writer of the project goes through here.
The temporary name is opened like any new file, so the result gets the umask's mode."""
from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from minbert.model import default_file_mode


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` to write; when the block ends without an error it
    gets the mode ``open()`` would give and replaces ``path`` in one rename, otherwise it is
    removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
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


def save_dir_atomic(target, write) -> None:
    """Call ``write(tmp_dir)``, then swap the finished directory into place, so a crash or
    kill at any moment leaves either the old complete checkpoint or the new one."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.tmp")
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
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
