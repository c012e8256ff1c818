"""The run directory: what a training command writes (``--out-dir``) and how the other commands find
their way in it.

    RUN/
      .lock            while a process works in it (``hold``): one run per directory
      config.json      every setting of the run
      environment.json what it ran with, one record per session (start, each --resume)
      metrics.jsonl    one JSON object per evaluation, with "step"
      tb/              TensorBoard events
      best/            the best checkpoint by the run's dev metric
      last/            the newest checkpoint, plus training_state.pt for --resume

``Run`` writes it (rank 0 only), holding its lock; ``resolve_encoder_path`` and ``run_settings`` read it for every
command that takes a run where a checkpoint is expected (``SentenceEncoder.from_pretrained``,
``--init``, ``--encoder``, the model card, ``python -m bertcf.st_format upgrade``).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from minbert import CheckpointError
from minbert.model import has_weights

from .errors import UsageError
from .utils import environment, lock
from .utils.distributed import dist_info
from .utils.files import write_json_atomic, write_text_atomic

STATE_FILE = "training_state.pt"  # in last/: optimiser, scheduler, data order and RNG for --resume
ENVIRONMENT_FILE = "environment.json"  # {"sessions": [the start's record, each --resume's]}
RUN_ENTRIES = ("last", "metrics.jsonl", "tb")  # what a run directory holds before it has a best/
ATTEMPT_ENTRIES = ("best", "metrics.jsonl", "tb")  # what a run writes before its first last/


def resolve_encoder_path(path):
    """A path that may be a run directory -> the checkpoint directory to load.

    A run directory (``--out-dir`` of a training run: ``config.json`` with the run's settings,
    ``metrics.jsonl``, ``tb/``, ``best/``, ``last/``) stands for its ``best/`` checkpoint. It is
    recognised by having no weights of its own and a ``best/`` (or, for a run that has not
    written one yet, ``last/``, ``metrics.jsonl`` or ``tb/``), never by its ``config.json``,
    which a checkpoint directory has too. Anything else (a checkpoint directory, a hub name)
    is returned unchanged. This is the one place that knows this: SentenceEncoder.from_pretrained,
    pretrain's ``--init`` and multitask's ``--encoder`` all go through it.

    Raises CheckpointError, naming the directory, for a run directory without ``best/``."""
    p = Path(path)
    if not is_run_dir(p):
        return path
    if (p / "best").is_dir():
        return p / "best"
    raise CheckpointError(f"run directory {p} has no best/ checkpoint yet (the run stopped before "
                          f"its first evaluation?); pass a run that got that far, or a checkpoint directory")


def is_run_dir(p: Path) -> bool:
    """Whether ``p`` is a training run's directory (see ``resolve_encoder_path``)."""
    return (p.is_dir() and not has_weights(p)
            and ((p / "best").is_dir() or any((p / name).exists() for name in RUN_ENTRIES)))


def run_settings(path) -> tuple[Path, dict] | None:
    """The training run that ``path`` is (a run directory) or comes from (its best/ or last/
    checkpoint): (its directory, its settings from its config.json), or None for any other path
    (a checkpoint directory outside a run, a hub name)."""
    p = Path(path)
    run = p if is_run_dir(p) else p.parent if p.name in ("best", "last") and is_run_dir(p.parent) else None
    if run is None or not (run / "config.json").is_file():
        return None
    try:
        return run, json.loads((run / "config.json").read_text())
    except (OSError, ValueError):
        raise CheckpointError(f"{run / 'config.json'} (the settings of run {run}) is not a readable JSON file; "
                              f"give its checkpoint, {run / 'best'}, with the data flags") from None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether a run directory holds a run to keep: a last/ checkpoint to continue (or the old copy
    that a kill between ``save_dir_atomic``'s two renames leaves, which ``recover_dir`` puts back),
    or the results of a finished one (stage 3's metrics.json and predictions, kept without last/
    by ``--keep-last none``)."""
    return any((run_dir / name).exists() for name in ("last", ".last.old", "metrics.json", "predictions"))


def default_out_dir(stage: str, method: str) -> str:
    return str(Path("runs") / f"{stage}-{method}-{datetime.now():%Y%m%d-%H%M%S}")


def model_name(model, fallback: str) -> str:
    """What a default run directory calls the model it starts from: a run's name for the run (or
    its best/), else the checkpoint directory's or hub name's last part (``fallback`` when empty)."""
    source = Path(str(resolve_encoder_path(model)))
    return (source.parent.name if source.name == "best" else source.name) or fallback


def check_out_dir(out_dir) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir} is a file, not a directory")
    return out_dir


@contextmanager
def hold(out_dir):
    """The lock of the run directory ``out_dir`` (``utils.lock``) for the block: a command takes it
    before it writes anything there, and a second process is refused (UsageError, one line naming
    the holder). Under torchrun only rank 0 writes, so only rank 0 locks (it is asked before
    torch.distributed starts, so by torchrun's RANK). Directories that taking it created are
    removed again when the block leaves them empty (a command stopped by bad input)."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield None
        return
    with lock.DirLock(check_out_dir(out_dir), hint="wait for it to end, or choose another --out-dir") as held:
        yield held


def read_environment(run_dir) -> list[dict]:
    """The sessions of a run's environment.json ([] when it has none or it is unreadable)."""
    try:
        sessions = json.loads((Path(run_dir) / ENVIRONMENT_FILE).read_text())["sessions"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []


class Run:
    """A run directory: config.json, metrics.jsonl, tb/ (TensorBoard). Only rank 0 writes.

    ``record``: write config.json and this session's environment record now (default: unless
    ``resume``); a resumed run calls ``record()`` once its checkpoint has loaded (``TrainingLoop.resume``),
    so that a --resume refused on the way leaves the run's record as it was."""

    def __init__(self, out_dir, config: dict, resume: bool = False, record: bool | None = None):
        self.dir = check_out_dir(out_dir)
        self.config = config
        self.resume = resume
        self.rank, _ = dist_info()
        self.writer = None
        self._lock = None
        self.environment = None  # this session's record (rank 0)
        if self.rank != 0:
            return
        if not lock.held(self.dir):  # the commands hold it already (``hold``); anyone else takes it here
            self._lock = lock.DirLock(self.dir, hint="wait for it to end, or choose another --out-dir").acquire()
        if not resume and has_checkpoint(self.dir):
            self._release()
            raise UsageError(f"{self.dir} already holds a run: pass --resume to continue it, "
                             f"or choose another --out-dir")
        if not resume:
            self._clear_attempt()
        if (not resume) if record is None else record:
            self.record()

    def record(self) -> None:
        """Write config.json (the settings --resume restores) and add this session to environment.json."""
        if self.rank != 0:
            return
        write_json_atomic(self.dir / "config.json", self.config)
        self.environment = self._record_environment()

    def _clear_attempt(self) -> None:
        """What an attempt that stopped before its first checkpoint left (a crash, a kill): with no
        last/ there is nothing to continue, so a new run takes the directory, starting afresh."""
        left = [name for name in ATTEMPT_ENTRIES if (self.dir / name).exists()]
        if not left:
            return
        print(f"note: {self.dir} holds an attempt that stopped before its first checkpoint (no last/); "
              f"starting afresh: {', '.join(left)} removed", file=sys.stderr)
        for name in left:
            path = self.dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    def _record_environment(self) -> dict:
        """Add this session's record to environment.json (kept apart from config.json, which holds
        the settings that --resume restores); a resumed run whose environment differs from its
        latest session's says so in one line on stderr."""
        sessions = read_environment(self.dir) if self.resume else []
        record = {"session": "resume" if self.resume else "start",
                  "started": datetime.now().isoformat(timespec="seconds"),
                  **environment.collect(self.config.get("device"), self.config.get("precision"))}
        changed = environment.differences(sessions[-1], record) if sessions else []
        if changed:
            print(f"warning: {self.dir} ran with another environment until now: "
                  + ", ".join(f"{k} {old} -> {new}" for k, old, new in changed)
                  + f" (both in {ENVIRONMENT_FILE})", file=sys.stderr)
        write_json_atomic(self.dir / ENVIRONMENT_FILE, {"sessions": sessions + [record]})
        return record

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def start(self, step: int) -> None:
        """Open TensorBoard at ``step``; a resumed run first drops what a killed run logged
        after the checkpoint it resumes from (TensorBoard events and metrics.jsonl lines)."""
        if self.rank != 0:
            return
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(self.dir / "tb"), purge_step=step if self.resume else None)
        if self.resume:
            self._truncate_metrics(step)

    def _truncate_metrics(self, step: int) -> None:
        path = self.dir / "metrics.jsonl"
        if path.exists():
            records = [r for r in read_metrics(path) if r["step"] <= step]
            write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))

    def scalars(self, step: int, values: dict, prefix: str = "") -> None:
        if self.writer is None:
            return
        for k, v in values.items():
            self.writer.add_scalar(f"{prefix}{k}", float(v), step)

    def histogram(self, step: int, name: str, values) -> None:
        if self.writer is not None:
            self.writer.add_histogram(name, values, step)

    def metrics(self, step: int, values: dict) -> None:
        """One line of metrics.jsonl (and the same numbers in TensorBoard under eval/). A value may
        be an interval [lo, hi]: a list in metrics.jsonl, NAME_lo and NAME_hi in TensorBoard."""
        if self.writer is None:
            return
        values = {k: [float(x) for x in v] if isinstance(v, (list, tuple)) else float(v) for k, v in values.items()}
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")
        scalars = {}
        for k, v in values.items():
            scalars |= {f"{k}_lo": v[0], f"{k}_hi": v[1]} if isinstance(v, list) else {k: v}
        self.scalars(step, scalars, prefix="eval/")
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self._release()


def read_metrics(path) -> list[dict]:
    """The records of a run's metrics.jsonl. A torn last line (a run killed, or a machine that lost
    power, while appending it) is dropped with a note; a damaged line before it means the file is
    not what the run wrote: CheckpointError naming the file and line."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line) if line.strip() else None
            if record is not None and not (isinstance(record, dict) and isinstance(record.get("step"), int)):
                raise ValueError("not a record with a step")
        except ValueError:
            if number == len(lines):
                print(f"note: {path}: its last line was cut off (the run stopped while writing it); dropped",
                      file=sys.stderr)
                break
            raise CheckpointError(f"{path} line {number} is not a metrics record (the file is damaged); "
                                  f"--resume cannot continue from it: delete that line, or start a new run") from None
        if record is not None:
            records.append(record)
    return records
