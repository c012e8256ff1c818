"""Typed settings as frozen dataclasses whose fields carry their help and their checks (as SimCSE's
argument dataclasses do): ``option`` declares a field, ``Settings`` checks every field whenever an
object is built (from the command line or from Python) and writes the command line's flags from
the fields, so a flag, its default, its help and its check are written once.

    @dataclass(frozen=True)
    class Memory(Settings):
        GROUP = "memory"
        mini_batch_size: int | None = option(None, "embed the batch M rows at a time", type=AT_LEAST_1)

    Memory(mini_batch_size=0)   # UsageError: mini_batch_size must be at least 1, not 0
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from typing import ClassVar

from .errors import UsageError


def option(default, help: str, *, type=None, choices=None, flag: str | None = None, switch: bool = False,
           nargs=None, metavar: str | None = None, group: str | None = None, required: bool = False):
    """A setting that is also a flag (``--name-with-dashes`` unless ``flag``): ``type`` converts the
    flag's text and, when made by ``cli.checked``, checks a value given from Python too; ``choices``
    the values allowed; ``switch`` a flag without a value (store_true); ``group`` the --help group
    (default: the declaring class's ``GROUP``); ``required``: the command line must give it."""
    meta = {"help": help, "type": type, "choices": tuple(choices) if choices else None, "flag": flag,
            "switch": switch, "nargs": nargs, "metavar": metavar, "group": group, "cli": True, "required": required}
    return field(default=default, metadata=meta)


def derived(default=None, help: str = "", default_factory=dataclasses.MISSING):
    """A setting no flag gives: one the resolution fills in (the command line, what a preset set),
    kept in config.json beside the flags."""
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"help": help, "cli": False})
    return field(default=default, metadata={"help": help, "cli": False})


def redefault(owner: type, name: str, default=dataclasses.MISSING, **changes):
    """``owner``'s field ``name`` with another default (or ``help``, ``choices``, ``group``, ``flag``,
    ``metavar``), for a command whose default differs: declared once, in ``owner``; its help group
    stays ``owner``'s."""
    original = owner.__dataclass_fields__[name]
    meta = dict(original.metadata) | {"group": original.metadata.get("group") or owner.GROUP} | changes
    return field(default=original.default if default is dataclasses.MISSING else default, metadata=meta)


def _check(f: dataclasses.Field, value) -> None:
    meta = f.metadata
    if value is None and meta.get("required"):
        raise UsageError(f"{f.name} is required")
    if value is None and (f.default is None or not meta.get("cli", True)):
        return
    values = value if meta.get("nargs") and isinstance(value, (list, tuple)) else [value]
    for v in values:
        if meta.get("switch") and not isinstance(v, bool):
            raise UsageError(f"{f.name} must be True or False, not {v!r}")
        if meta.get("choices") and v not in meta["choices"]:
            raise UsageError(f"{f.name} must be one of {', '.join(map(str, meta['choices']))}, not {v!r}")
        check = meta.get("type")
        good = getattr(check, "good", None)
        if good is not None and (v is None or not good(v)):
            raise UsageError(f"{f.name} must be {check.what}, not {v!r}")


@dataclass(frozen=True)
class Settings:
    """A frozen set of settings: every field checked when an object is built; ``to_dict`` gives
    what config.json records; ``add_arguments`` the flags of every field that is one."""

    GROUP: ClassVar[str | None] = None  # the --help group of the fields this class declares

    def __post_init__(self):
        for f in fields(self):
            _check(f, getattr(self, f.name))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def replace(self, **changes):
        """A copy with ``changes`` (checked as on construction)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def pick(cls, source) -> dict:
        """The values of this class's fields that ``source`` (an object with attributes, or a dict)
        has: what builds one of these from a larger set of settings."""
        get = source.get if isinstance(source, dict) else lambda k, d=None: getattr(source, k, d)
        missing = object()
        return {name: value for name in cls.names() if (value := get(name, missing)) is not missing}

    @classmethod
    def group_of(cls, name: str) -> str | None:
        meta = cls.__dataclass_fields__[name].metadata
        if meta.get("group"):
            return meta["group"]
        for klass in cls.__mro__:
            if name in klass.__dict__.get("__annotations__", {}):
                return klass.__dict__.get("GROUP")
        return None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, only=None) -> None:
        """A flag for every field that is one (``only``: these names alone), in --help groups."""
        groups: dict[str | None, object] = {}
        for f in fields(cls):
            meta = f.metadata
            if not meta.get("cli") or (only is not None and f.name not in only):
                continue
            title = cls.group_of(f.name)
            if title not in groups:
                groups[title] = parser.add_argument_group(title) if title else parser
            kwargs = {"dest": f.name, "default": f.default, "help": meta["help"]}
            if meta.get("required"):
                kwargs["required"] = True
            if meta["switch"]:
                kwargs["action"] = "store_true"
            else:
                kwargs |= {k: meta[k] for k in ("type", "choices", "nargs", "metavar") if meta[k] is not None}
            groups[title].add_argument(meta["flag"] or "--" + f.name.replace("_", "-"), **kwargs)
