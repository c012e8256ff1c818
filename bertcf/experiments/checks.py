"""What stands in a planned run's way before anything runs: the state of its directory on disk
(done, resume, restart, new), whether a finished or interrupted run can be reused as it is, the
inputs the runs need, and their flags (parsed by the run's own command)."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from ..data.tasks import TASKS, task_file
from ..data.words import word_similarity_files
from ..errors import DataError, UsageError
from ..runs import ENVIRONMENT_FILE, STATE_FILE
from ..utils.files import recover_dir
from .planned import MARKER, PlannedRun, finetune_config, pretraining_config, read_json

#: What a run directory of this command may hold (anything else: files it did not write).
RUN_ENTRIES = {"config.json", ENVIRONMENT_FILE, "metrics.jsonl", "tb", "best", "last", "predictions", "metrics.json",
               MARKER}


def inspect(task: PlannedRun) -> None:
    """Set task.state: done (finished, reuse), resume (continue from last/), restart
    (an attempt that left no checkpoint: cleared and started again) or new."""
    d = task.dir
    task.marker = read_json(d / MARKER) or {}
    if task.marker.get("status") == "done":
        task.state = "done"
        return
    last = recover_dir(d / "last") if d.exists() else d / "last"
    if (last / STATE_FILE).is_file():
        task.state = "resume"
    elif d.exists() and any(d.iterdir()):
        task.state = "restart"
    else:
        task.state = "new"


def problem(task: PlannedRun, rel) -> str | None:
    """Why a finished or interrupted run cannot be used as it is: it was started with
    other settings, or from a version of the pretraining it starts from that has changed since.
    ``rel``: a path as the messages show it (``Plan.rel``)."""
    if task.state not in ("done", "resume"):
        return None
    if task.marker.get("settings") is not None:
        old, new = task.marker["settings"], json.loads(json.dumps(task.settings))
        diff = [f"{k}={old.get(k)!r} (now {new.get(k)!r})" for k in sorted(set(old) | set(new))
                if old.get(k) != new.get(k)]
        if diff:
            return f"{task.dir} was started with other settings: {', '.join(diff)}"
    if task.depends:
        dep = task.depends
        dep_finished = dep.marker.get("finished") if dep.state == "done" else None
        if task.marker.get("init_finished") not in (None, dep_finished):
            return f"{task.dir} was trained from a {rel(dep.dir)} that has changed since"
    return None


def check(task: PlannedRun, rel) -> None:
    """UsageError when the run cannot be reused, or its directory holds files it did not write."""
    found = problem(task, rel)
    if found:
        raise UsageError(f"{found}; delete {task.dir} to run it again, or use another --out-dir")
    if task.state == "restart":
        unknown = [p.name for p in task.dir.iterdir() if p.name not in RUN_ENTRIES and not p.name.startswith(".")]
        if unknown:
            raise UsageError(f"{task.dir} holds files this command did not write ({', '.join(unknown[:3])}); "
                             f"move them away or use another --out-dir")


def input_problems(plan, tasks: list[PlannedRun]) -> list[Exception]:
    """What the runs need and cannot find (the data directory, data files, a corpus), each as
    the error that stops the command; a dry run lists them instead."""
    a, data_dir = plan.args, plan.data_dir
    if not data_dir.is_dir():
        return [DataError(f"--data-dir {data_dir} is not a directory (see data/README.md)")]
    needed = [task_file(data_dir, "sts", "dev")]
    if "analysis" in plan.commands:
        needed += [task_file(data_dir, "qqp", "train")]
    if plan.finetune:
        needed += [task_file(data_dir, t, s) for t in TASKS for s in ("train", "dev")]
    problems = []
    if a.lexical_dir:
        try:
            word_similarity_files(a.lexical_dir)
        except DataError as e:
            problems.append(e)
    pending = [t.spec for t in tasks if t.kind == "pretraining" and t.state != "done"]
    if any(spec.reads_corpus for spec in pending):
        if a.corpus_from_tasks:
            needed += [task_file(data_dir, t, "train") for t in TASKS]
        elif a.corpus:
            needed += [Path(a.corpus)]
        elif not (data_dir / "wiki1m_for_simcse.txt").is_file():
            problems.append(UsageError(f"no pretraining corpus: give --corpus FILE or --corpus-from-tasks "
                                       f"({data_dir / 'wiki1m_for_simcse.txt'} not found)"))
    methods = {spec.method for spec in pending}
    if methods & {"sbert-softmax", "simcse-sup"}:
        if not a.nli_list:
            problems.append(UsageError("supervised needs --nli FILE[,FILE] (SNLI/MultiNLI .jsonl or .txt, or a "
                                       "premise<TAB>hypothesis<TAB>label TSV)"))
        needed += [Path(f) for f in a.nli_list]
    if "sbert-cosine" in methods:
        needed += [task_file(data_dir, "sts", "train")]
    missing = list(dict.fromkeys(str(p) for p in needed if not Path(p).is_file()))
    if missing:
        problems.append(DataError(f"missing input file(s): {', '.join(missing)} (see data/README.md)"))
    return problems


class BadFlags(UsageError):
    """A planned run that its own command would refuse for its flags (a row's, --pretrain-args',
    --finetune-args'): a dry run lists it, and exits with status 2."""


#: The fine-tuning settings the plan gives each row and seed. In --finetune-args one would be every
#: row's: one directory for all of them (--out-dir), one encoder, one seed, or a run the plan does
#: not manage (--resume, --predict-only).
PLANNED_FINETUNE_SETTINGS = ("out_dir", "encoder", "init", "model", "seed", "resume", "predict_only", "checkpoint")


def validate_flags(task: PlannedRun) -> None:
    """A run's config built and resolved now as it will be run (``planned.pretraining_config``,
    ``planned.finetune_config``: its settings checked as its command checks them, its notes not
    shown); a fine-tuning's tasks declared and checked too (``check_finetune``). BadFlags, naming
    the run, for what its command would refuse."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            if task.kind == "pretraining":
                pretraining_config(task)
            else:
                check_finetune(task)
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()
        raise BadFlags(f"{task.description.split(',')[0]}: {message[-1] if message else 'bad flags'}") from None
    except (UsageError, DataError) as e:
        raise BadFlags(f"{task.description.split(',')[0]}: {e}") from None


def check_finetune(task: PlannedRun) -> None:
    """What ``run_multitask.py`` checks before it writes anything, on the config the plan will run
    (its flags, then --finetune-args'): the settings, the declared tasks and their files, the
    methods on them; and no --finetune-args flag that is the plan's (``PLANNED_FINETUNE_SETTINGS``)."""
    from ..cli import given_flags
    from ..multitask import config as multitask
    from ..multitask.data import check_files
    from ..multitask.declarations import declared_tasks
    from ..multitask.checks import check_run

    config = finetune_config(task, task.state == "resume")  # parses the words: an unknown flag ends here
    planned = [name for name in PLANNED_FINETUNE_SETTINGS
               if name in given_flags(multitask.build_parser(), task.words)]
    if planned:
        raise UsageError(f"--finetune-args: --{planned[0].replace('_', '-')} is set by the plan for each row and "
                         f"seed; given here, every fine-tuning would share it")
    tasks = declared_tasks(config)
    check_run(config, tasks, declared=True)
    check_files([t for t in tasks if not t.reader])  # the built-in tasks' files: input_problems
