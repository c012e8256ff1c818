"""Opening the data's text files: a missing file, a directory, an unreadable file or bytes that
are not text in the expected encoding give one ``DataError`` line naming the file, for every reader
of ``bertcf.data`` alike."""
from __future__ import annotations

from pathlib import Path

from ..errors import DataError


def _name(path: Path, what: str) -> str:
    return f"{what} {path}" if what else str(path)


def open_text(path: Path, what: str = "", newline: str = "", encoding: str = "utf-8-sig", hint: str = ""):
    """``open(path)`` for reading (UTF-8, a BOM dropped, by default); ``what`` says what the file is
    and ``hint`` where to get it (both in the message)."""
    try:
        return open(path, encoding=encoding, newline=newline)
    except FileNotFoundError:
        raise DataError(f"{_name(path, what)} not found" + (f" ({hint})" if hint else "")) from None
    except IsADirectoryError:
        raise DataError(f"{_name(path, what)} is a directory, not a file") from None
    except OSError as error:
        raise DataError(f"cannot read {_name(path, what)}: {error.strerror or error}") from None


def not_text(path: Path, error: UnicodeDecodeError, what: str = "") -> DataError:
    """The DataError for bytes of ``path`` that do not decode."""
    encoding = "UTF-8" if error.encoding.replace("_", "-").startswith("utf-8") else error.encoding
    return DataError(f"{_name(path, what)} is not valid {encoding} text (byte {error.start})")


def read_lines(path: Path, what: str = "", encoding: str = "utf-8-sig") -> list[str]:
    """The lines of a text file, without their ends."""
    with open_text(path, what, encoding=encoding) as handle:
        try:
            return handle.read().splitlines()
        except UnicodeDecodeError as error:
            raise not_text(path, error, what) from None
