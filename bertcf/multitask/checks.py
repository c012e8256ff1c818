"""What stage 3 refuses before a run writes anything, each in one line (UsageError): the tasks given
to ``MultitaskTrainer``, a task that no head reads, methods that cannot run on the tasks, settings
that would be recorded but not applied, and a --resume whose settings or tasks are not the run's.
``check_run`` is the one check that the trainer, the command and the experiments' plan call; the
settings' rules among themselves are ``config.check_settings``'s."""
from __future__ import annotations

import json
from pathlib import Path

from .. import cli, runs
from ..errors import UsageError
from ..utils.distributed import dist_info
from .config import MultitaskConfig
from .declarations import declared_tasks
from .heads import head_type
from .legacy import renamed_from_para
from .methods import StepMethods
from .tasks import BUILTIN, DEFAULTS, REPORT, SPLITS, Task


def check_run(config: MultitaskConfig, tasks: list[Task], declared: bool = False) -> None:
    """What is refused before a run writes anything (UsageError, one line): a --resume whose
    settings or tasks are not the run's, a task that no head reads as the pairs are encoded,
    methods that cannot run on these tasks, settings that would be recorded but not applied.
    ``declared``: ``tasks`` are those ``config`` declares (``declarations.declared_tasks``, read
    once by the caller), not Task objects given from Python."""
    check_resumable(config, tasks)
    heads = {task.name: head_type(task, config.pair_encoding) for task in tasks}  # a head for each task
    StepMethods.check(config, tasks, dist_info()[1])
    check_head_settings(config, tasks, heads)
    check_task_settings(config, tasks, declared)


def check_head_settings(config: MultitaskConfig, tasks: list[Task], heads: dict) -> None:
    """--proj-dim and a task's margin given where no head reads them (``TaskHead.uses``: a sentence's
    head and the pairs read jointly have neither) refused in one line. ``heads``: task name -> its
    head class (``head_type``)."""
    how = f"--pair-encoding {config.pair_encoding}"
    if (config.proj_dim != MultitaskConfig.__dataclass_fields__["proj_dim"].default
            and not any("proj_dim" in head.uses for head in heads.values())):
        raise UsageError(f"--proj-dim {config.proj_dim} does not apply: no task's head projects a pair's sentences "
                         f"({how}: {', '.join(f'{t} {h.name}' for t, h in heads.items())}); leave it out")
    for task in tasks:
        default = REPORT.get(f"{task.reader}_margin", DEFAULTS["margin"])  # a built-in task's is the report's
        if task.margin != default and "margin" not in heads[task.name].uses:
            given = f"--{task.name}-margin" if task.reader == task.name else "its margin"
            raise UsageError(f"task {task.name!r}: {given} {task.margin} does not apply to its {heads[task.name].name} "
                             f"head ({how}), which compares no cosine; leave it out")


def check_task_list(tasks) -> list[Task]:
    """``tasks`` (what ``MultitaskTrainer`` is given) as a list: Task objects with distinct names,
    at least one; UsageError otherwise."""
    given = repr(tasks) if len(repr(tasks)) < 60 else f"a {type(tasks).__name__}"
    if not isinstance(tasks, (str, dict)) and hasattr(tasks, "__iter__"):  # a dict: its values were meant?
        tasks = list(tasks)
    if not isinstance(tasks, list) or not tasks:
        raise UsageError(f"MultitaskTrainer needs a list of tasks (Task objects; "
                         f"list(builtin_tasks(data_dir).values()) gives the report's), not {given}")
    for task in tasks:
        if not isinstance(task, Task):
            raise UsageError(f"MultitaskTrainer: the tasks are Task objects, not {task!r} ({type(task).__name__}); "
                             f"builtin_tasks(data_dir)[name] gives a built-in one")
    names = [t.name for t in tasks]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise UsageError(f"MultitaskTrainer: task {twice!r} is given twice (each task's name names its head, metric "
                         f"and files)")
    return tasks


def check_state_kept(run_dir: Path, config: MultitaskConfig) -> None:
    """--resume of a finished run (metrics.json) whose last/ kept no training state (--keep-last):
    UsageError, saying so, rather than the loop's 'never reached its first checkpoint'."""
    if (run_dir / "metrics.json").is_file() and not (run_dir / "last" / runs.STATE_FILE).is_file():
        raise UsageError(f"--resume: {run_dir} finished and kept no training state (--keep-last weights or none); "
                         f"start a new run, from its best checkpoint with --encoder {run_dir / 'best'}")


#: The settings of the built-in tasks: flag's name -> (task, the Task field it sets).
BUILTIN_SETTINGS = {**{key: tuple(key.split("_", 1)) for key in REPORT},
                    **{f"{task}_{split}": (task, split) for task in BUILTIN for split in SPLITS}}
#: What a resumed run may change: how long it runs, where, and how it reports, none of which
#: changes what a step trains on. Any other setting must be the run's: else the run would be two.
RESUME_MAY_CHANGE = ("steps", "device", "precision", "progress", "log_every", "eval_every", "save_every",
                     "patience", "compile", "batch_size", "conflict_every", "keep_last", "prediction_labels",
                     "resume", "out_dir", "command")
#: The settings that declare the tasks: a resumed run compares the declarations they give (a task
#: file's contents, not its path), not the settings.
TASK_SOURCES = ("data_dir", "task_file", "task", "tasks", *(f"{t}_{s}" for t in BUILTIN for s in SPLITS))


def check_task_settings(config: MultitaskConfig, tasks: list, declared: bool = False) -> None:
    """UsageError for a setting that would be recorded but not applied: a built-in task's flag
    (``--qqp-weight 3``, ``--sst-train F``) given while the trained task is declared otherwise (by
    a task file, or as the Task objects given to ``MultitaskTrainer``); from Python, such a flag
    for a built-in task that is not among the Task objects given, and a task file, --task or
    --tasks beside Task objects that are not theirs. ``declared``: the tasks are those ``config``
    declares (the command's; then --tasks may leave out a built-in task that its flags set)."""
    if not declared and (config.task_file or config.task or config.tasks is not None):
        if _declared(config) != list(tasks):
            raise UsageError("--task-file, --task and --tasks do not apply to the tasks given as Task objects: "
                             "leave them out, or train the tasks they declare (declarations.declared_tasks)")
        declared = True  # the Task objects are the ones the settings declare
    by_name = {t.name: t for t in tasks}
    fields = MultitaskConfig.__dataclass_fields__
    for key, (name, field) in BUILTIN_SETTINGS.items():
        value, task = getattr(config, key), by_name.get(name)
        if value == fields[key].default or task is None and declared:  # not given, or its task left out by --tasks
            continue
        flag = f"--{key.replace('_', '-')} {value}"
        if task is None:
            raise UsageError(f"{flag} does not apply: no task {name!r} among the tasks given (it sets the built-in "
                             f"{name}; builtin_tasks(data_dir, ...) takes the built-in tasks' settings)")
        if task.reader != name:
            raise UsageError(f"{flag} does not apply: task {name!r} is declared anew (kind {task.kind}), not as "
                             f"the built-in {name}")
        if getattr(task, field) != value:
            raise UsageError(f"{flag} does not apply: task {name!r} is declared with {field} "
                             f"{getattr(task, field)!r} (its declaration decides)")


def _declared(config: MultitaskConfig) -> list | None:
    """The tasks ``config``'s own settings declare; None where they declare none that can run
    (then they are not the tasks given either, and that is the one line to show)."""
    try:
        return declared_tasks(config)
    except UsageError:
        return None


def check_resumable(config: MultitaskConfig, tasks: list) -> None:
    """For --resume: UsageError, one line naming the first difference, when a setting or a task
    declaration is not what the run's config.json records (``RESUME_MAY_CHANGE`` aside). Checked
    before anything is written, so a refused --resume leaves the run as it was."""
    if not config.resume:
        return
    record = Path(config.out_dir) / "config.json"
    saved = renamed_from_para(cli.saved_settings(config.out_dir))
    fields = MultitaskConfig.__dataclass_fields__
    now = _as_recorded(config.to_dict())
    for name, value in now.items():
        if name in RESUME_MAY_CHANGE or name in TASK_SOURCES:
            continue
        # a setting newer than the run: it ran with the setting's default
        was = saved[name] if name in saved else _as_recorded(fields[name].default)
        if value != was:
            flag = f"--{name.replace('_', '-')}"
            raise UsageError(f"--resume: {flag} is {_shown(value)} here, {_shown(was)} in {record}; leave {flag} "
                             f"out to continue with the run's, or start a new run")
    if "declared_tasks" not in saved:  # a run from before tasks were declared: its settings say it all
        return
    recorded = [d for d in saved["declared_tasks"] if isinstance(d, dict)]
    names, was_names = [t.name for t in tasks], [d.get("name") for d in recorded]
    if names != was_names:
        raise UsageError(f"--resume: the run trains {', '.join(map(str, was_names))}, in that order ({record}); "
                         f"these settings declare {', '.join(names)}: give the run's --tasks and declarations, or "
                         f"start a new run")
    for task, was_task in zip(tasks, recorded):
        for field, value in _as_recorded(task.to_dict()).items():
            was = was_task[field] if field in was_task else _as_recorded(DEFAULTS[field])
            if value != was:
                raise UsageError(f"--resume: task {task.name!r}: {field} is {_shown(value)} here, {_shown(was)} in "
                                 f"{record}; restore its declaration, or start a new run")


def _as_recorded(value):
    """``value`` as config.json holds it (tuples as lists), to compare with what it holds."""
    return json.loads(json.dumps(value))


def _shown(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)
