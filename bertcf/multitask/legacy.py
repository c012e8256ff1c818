"""What stage 3 reads of the files older versions wrote, in one place: QQP's old name ``para`` (in
flags, settings, metrics, tensor names and training states), and checkpoints, runs and training
states from before tasks were declared (the report's three tasks, set by their flags).

Each reader of a run's or a checkpoint's files goes through these: ``renamed_from_para`` for any
dict it reads, ``checkpoint_builtin_tasks`` and ``run_builtin_tasks`` where no declaration was
recorded, ``upgrade_state`` for a training state that --resume loads."""
from __future__ import annotations

from .tasks import BUILTIN, REPORT, SPLITS, Task, builtin_tasks

#: Old flags (before QQP was called qqp) -> their names now.
RENAMED_FLAGS = {f"--para-{name}": f"--qqp-{name}" for name in ("dropout", "margin", "batch-size", "weight", *SPLITS)}


def renamed_from_para(d: dict) -> dict:
    """``d`` (and the dicts inside it) with QQP's old name in keys replaced: 'para' -> 'qqp',
    'para_*' -> 'qqp_*' (flags para_batch_size, metric para_acc, tensors para_head.*). Files
    written before QQP had one name in the code (config.json, metrics.json, multitask.json,
    heads and training state) are read through it."""
    def key(k):
        return "qqp" + k[4:] if isinstance(k, str) and (k == "para" or k.startswith("para_")) else k
    return {key(k): renamed_from_para(v) if isinstance(v, dict) else v for k, v in d.items()}


def checkpoint_builtin_tasks(meta: dict) -> list[Task]:
    """The tasks of a checkpoint written before tasks were declared: the report's three, with the
    head settings its multitask.json ``meta`` holds (sst_dropout, qqp_margin, ...)."""
    return list(builtin_tasks(**{k: v for k, v in meta.items() if k in REPORT}).values())


def run_builtin_tasks(config: dict) -> list[Task]:
    """The tasks of a run started before tasks were declared: the report's three, their files
    those its config.json ``config`` names (or the standard ones in its data directory)."""
    files = {(t, s): config.get(f"{t}_{s}") for t in BUILTIN for s in SPLITS}
    return list(builtin_tasks(config.get("data_dir", "data"), files).values())


def upgrade_state(state: dict) -> dict:
    """A training state from before tasks were declared: QQP's old name; no task sampler yet (every
    task had a batch at every step)."""
    state = renamed_from_para(state)
    counts = dict.fromkeys(state["samplers"], state["step"])
    state.setdefault("extra", {}).setdefault("task_sampler", {"counts": counts})
    return state
