"""Running the planned pretraining and fine-tuning runs, one after the other in this process: each keeps
a marker (``experiment.json``: running, done, interrupted) so that the same command continues
where it stopped."""
from __future__ import annotations

import shlex
import shutil
import time

from ..errors import DataError, NonFiniteLossError, UsageError, WriteError
from ..models.model_card import add_experiment_row
from ..utils.files import write_json_atomic
from .plan import Plan
from .planned import MARKER, PlannedRun, now, run_planned


class Interrupted(Exception):
    """A run stopped on Ctrl-C or SIGTERM (its state is saved); rerunning the command continues it.
    ``signal``: the signal's name."""

    def __init__(self, message: str, signal: str | None = None):
        super().__init__(message)
        self.signal = signal


def command_line(task: PlannedRun) -> str:
    script = "run_pretrain.py" if task.kind == "pretraining" else "run_multitask.py"
    resume = ["--resume"] if task.state == "resume" else []
    return shlex.join(["python", script] + task.argv + resume)

def execute(plan: Plan, tasks: list[PlannedRun]) -> None:
    """Run the planned runs in order; a finished one is reused."""
    n = len(tasks)
    for i, task in enumerate(tasks, 1):
        head = f"[{i}/{n}] {task.label}: {task.description}"
        if task.state == "done":
            print(f"{head}: finished earlier, reused", flush=True)
            continue
        note = {"resume": " (continuing the interrupted run)",
                "restart": " (the interrupted attempt left no checkpoint: starting it again)"}.get(task.state, "")
        print(head + note, flush=True)
        run_one(plan, task)

def run_one(plan: Plan, task: PlannedRun) -> None:
    """One pretraining or fine-tuning run, in this process, with its marker (experiment.json) kept up to date."""
    if task.state == "restart":
        shutil.rmtree(task.dir)
    task.dir.mkdir(parents=True, exist_ok=True)
    dep = task.depends
    marker = {"status": "running", "kind": task.kind, "row": task.label, "settings": task.settings,
              "argv": task.argv, "command": command_line(task),
              "init_finished": (dep.marker.get("finished") if dep else None),
              "started": task.marker.get("started", now()) if task.state == "resume" else now(),
              "wall_s": task.marker.get("wall_s", 0.0) if task.state == "resume" else 0.0}
    write_json_atomic(task.dir / MARKER, marker)
    what = f"{task.label} ({plan.rel(task.dir)})"
    tick = time.perf_counter()
    try:
        result = run_planned(task)
    except SystemExit as e:
        if e.code not in (0, None):
            raise UsageError(f"{what}: the run stopped with exit status {e.code}") from None
        result = None
    except (UsageError, DataError, NonFiniteLossError, WriteError) as e:
        raise type(e)(f"{what}: {e}") from None
    except Exception as e:
        from minbert import CheckpointError
        if isinstance(e, CheckpointError):
            raise CheckpointError(f"{what}: {e}") from None
        raise
    finally:
        marker["wall_s"] = marker["wall_s"] + time.perf_counter() - tick
    summary = result if isinstance(result, dict) else {}
    if summary.get("interrupted"):
        marker["summary"] = summary
        write_json_atomic(task.dir / MARKER, marker)
        raise Interrupted(f"{what} was stopped by {summary.get('signal') or 'a signal'}", summary.get("signal"))
    if not (task.dir / "best").is_dir():
        raise UsageError(f"{what}: the run finished without a best/ checkpoint")
    add_experiment_row(task.dir / "best", task.label, plan.command)
    marker |= {"status": "done", "finished": now(), "summary": summary}
    write_json_atomic(task.dir / MARKER, marker)
    task.marker, task.state = marker, "done"

