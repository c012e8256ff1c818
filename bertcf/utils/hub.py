"""Why a pretrained model named by the user cannot be loaded, in one line: a missing local
directory, a name the Hugging Face hub does not have, or a machine that cannot reach the hub and
whose cache does not hold it (``load_failure``). The loaders (transformers' ``from_pretrained``,
sentence-transformers' ``CrossEncoder``) raise a chain of errors whose first line rarely says
which; the commands turn it into a ``UsageError`` (exit status 2)."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError

#: huggingface_hub's errors (by name, so this module imports none of it) for each reason.
OFFLINE = ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectionError", "ConnectTimeout")
NOT_FOUND = ("RepositoryNotFoundError", "HFValidationError", "RevisionNotFoundError", "GatedRepoError",
             "RemoteEntryNotFoundError", "EntryNotFoundError")


def is_local(name) -> bool:
    """Whether ``name`` can only be a local path (absolute, ./ or ../, ~) or is one, not a hub name."""
    return str(name).startswith(("/", ".", "~")) or Path(name).expanduser().exists()


def chain(error: BaseException) -> list[BaseException]:
    """``error`` and every error it was raised from or during, in order (each once)."""
    out = []
    while error is not None and error not in out:
        out.append(error)
        error = error.__cause__ or error.__context__
    return out


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:160]}" if text else type(error).__name__


def reason(name, error: BaseException | None = None) -> str:
    """Why ``name`` did not load: not found, offline, or the loader's own first line."""
    if Path(name).expanduser().exists():
        return f"not a checkpoint this loader reads: {first_line(error)}" if error is not None else "unreadable"
    if is_local(name):
        return "not found: no such directory"
    errors = chain(error) if error is not None else []
    names, text = {type(e).__name__ for e in errors}, " ".join(map(str, errors))
    if names & set(OFFLINE) or "couldn't connect" in text or os.environ.get("HF_HUB_OFFLINE", "").upper() in (
            "1", "TRUE", "ON", "YES"):
        return "offline: not in the local Hugging Face cache, and the hub cannot be reached"
    if names & set(NOT_FOUND) or "not a valid model identifier" in text:
        return "not found: no such directory, and no such model on the Hugging Face hub"
    return first_line(error) if error is not None else "unknown"


def load_failure(what: str, name, error: BaseException | None = None) -> UsageError:
    """The one-line error of a model that could not be loaded: ``what`` it is (the flag), its name, why."""
    return UsageError(f"{what} {name} cannot be loaded ({reason(name, error)})")
