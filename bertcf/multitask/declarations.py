"""How stage-3 tasks are declared (docs/multitask.md): the built-in flags, a YAML or JSON task
file (``--task-file``) and ``--task key=value,...`` flags, read into ``tasks.Task`` objects and
narrowed by ``--tasks``."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..errors import UsageError
from .tasks import BUILTIN, KINDS, REPORT, SPLITS, Task, builtin_tasks

FIELDS = {f.name for f in dataclasses.fields(Task)} - {"reader"}
LIST_FIELDS = ("text_columns", "labels", "label_range")


def task_from_dict(entry, where: str, base_dir: Path | None = None, builtin: dict | None = None) -> Task:
    """A declaration (a dict, as in a task file) -> Task. An entry named like a built-in task
    replaces the fields it gives and keeps the others; relative file paths are taken from
    ``base_dir`` (the task file's folder)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise UsageError(f"{where}: each task is an object with a name, not {str(entry)[:60]!r}")
    name = entry["name"]
    unknown = sorted(set(entry) - FIELDS)
    if unknown:
        raise UsageError(f"task {name!r} ({where}): unknown field {unknown[0]!r} (fields: {', '.join(sorted(FIELDS))})")
    values = dict(entry)
    for split in SPLITS:
        if isinstance(values.get(split), str) and base_dir is not None and not Path(values[split]).is_absolute():
            values[split] = str(base_dir / values[split])
    try:
        if builtin and name in builtin and ("kind" not in values or values["kind"] == builtin[name].kind):
            return builtin[name].replace(**values)
        if "kind" not in values:
            raise UsageError(f"task {name!r} ({where}): no kind (kinds: {', '.join(KINDS)})")
        return Task(**values)
    except TypeError as e:  # a list where a number belongs, and the like
        raise UsageError(f"task {name!r} ({where}): {e}") from None


def read_task_file(path) -> list[dict]:
    """The declarations of a YAML or JSON task file: a list, or an object with a "tasks" list."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--task-file {path} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--task-file {path} cannot be read ({e})") from None
    try:
        if path.suffix.lower() == ".json":
            found = json.loads(text)
        else:
            import yaml
            found = yaml.safe_load(text)
    except Exception as e:  # JSONDecodeError, yaml.YAMLError
        first = " ".join(str(e).split())[:120]
        raise UsageError(f"--task-file {path} is not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'} "
                         f"({first})") from None
    if isinstance(found, dict) and "tasks" in found:
        found = found["tasks"]
    if not isinstance(found, list) or not found:
        raise UsageError(f"--task-file {path}: expected a list of tasks (or {{tasks: [...]}})")
    return found


def parse_task_flag(text: str) -> dict:
    """``name=snli,kind=pair-classification,text_columns=premise;hypothesis,num_classes=3`` -> a
    declaration (numbers as numbers, a column's digits as its position, header=false as False;
    ``;`` separates a list's items)."""
    entry = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"--task {text!r}: expected key=value pairs separated by commas")
        value = value.strip()
        if key in LIST_FIELDS:
            items = [v.strip() for v in value.split(";")]
            entry[key] = [_word_or_number(v) for v in items] if key == "label_range" else \
                [_position(v) for v in items] if key == "text_columns" else items
        elif key in ("label_column", "id_column"):
            entry[key] = _position(value)
        elif key == "header":
            entry[key] = {"true": True, "false": False}.get(value.lower(), value)
        else:
            entry[key] = _word_or_number(value) if key in ("num_classes", "weight", "batch_size", "dropout",
                                                           "margin") else value
    return entry


def _position(text: str):
    """A column given on the command line: its position when it is digits (header=false), else its name."""
    return int(text) if text.isdigit() else text


def _word_or_number(text: str):
    """A number given on the command line as a number; anything else as it is (the check names it)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def declared_tasks(config) -> list[Task]:
    """Every task ``config`` declares: the built-ins, then the task file's, then --task's (a later
    declaration of a name replaces the earlier one; two in one file or flag list are an error),
    narrowed to --tasks when given, in --tasks' order."""
    builtin = builtin_tasks(config.data_dir, {(t, s): config.file_of(t, s) for t in BUILTIN for s in SPLITS},
                            **{k: getattr(config, k) for k in REPORT})
    tasks = dict(builtin)
    sources = []
    if config.task_file:
        sources.append((read_task_file(config.task_file), f"--task-file {config.task_file}",
                        Path(config.task_file).parent))
    if config.task:
        sources.append(([parse_task_flag(t) for t in config.task], "--task", None))
    for entries, where, base in sources:
        seen = set()
        for entry in entries:
            task = task_from_dict(entry, where, base, builtin)
            if task.name in seen:
                raise UsageError(f"task {task.name!r} is declared twice in {where}")
            seen.add(task.name)
            tasks[task.name] = task
    if config.tasks is not None:  # "" too: a --tasks that names nothing is a mistake, not "every task"
        names = [n.strip() for n in config.tasks.split(",") if n.strip()]
        if not names:
            raise UsageError(f"--tasks {config.tasks!r} names no task (declared: {', '.join(tasks)})")
        unknown = [n for n in names if n not in tasks]
        if unknown:
            raise UsageError(f"--tasks: task {unknown[0]!r} is not declared (declared: {', '.join(tasks)})")
        if len(set(names)) != len(names):
            raise UsageError(f"--tasks {config.tasks}: a task is named twice")
        return [tasks[n] for n in names]
    return list(tasks.values())
