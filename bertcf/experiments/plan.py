"""What the experiments train (the report's rows and the pretraining runs behind them), and the
plan of one command: every pretraining and fine-tuning run as a ``PlannedRun`` with its command
line and its state on disk (finished, interrupted, new), checked before anything runs."""
from __future__ import annotations

import contextlib
import io
import json
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ..data import TASKS, DataError, task_file
from ..errors import UsageError
from ..files import recover_dir
from ..precision import resolve_device
from ..training import STATE_FILE
from .options import ALL

MARKER = "experiment.json"  # in every pretraining / fine-tuning directory this command runs
#: The report's steps per stage; ``--steps-scale`` multiplies them.
REPORT_STEPS = {"mirror": 10_000, "joint": 10_000, "flow": 10_000, "multitask": 5000}


@dataclass(frozen=True)
class Pretraining:
    """One run of ``run_pretrain.py`` (stage 1 or 2 of the report) in OUT/stages/<name>."""
    name: str
    stage: str              # its --stage: mirror | joint | flow
    method: str
    init: str | None        # another Pretraining's name, or None for --model
    flags: tuple = ()
    what: str = ""
    preset: str | None = None  # run_pretrain.py --preset: the method as published (its length included)


PRETRAININGS = {s.name: s for s in (
    Pretraining("simcse", "mirror", "simcse", None, what="SimCSE pretraining (dropout only)"),
    Pretraining("mirror", "mirror", "mirror", None, what="Mirror-BERT pretraining (dropout + span masking)"),
    Pretraining("flow", "flow", "flow", None, what="flow on L_flow alone, encoder frozen"),
    Pretraining("bertcf", "joint", "mirror", "mirror", what="joint flow + 0.3 L_mirror, encoder frozen"),
    Pretraining("simcse-joint", "joint", "simcse", "simcse", what="joint flow + 0.3 L_simcse, encoder frozen"),
    Pretraining("minbert-joint", "joint", "mirror", None, ("--unfreeze-encoder",),
                what="joint flow + 0.3 L_mirror, encoder unfrozen"),
    Pretraining("mirror-flow", "flow", "flow", "mirror", what="flow on L_flow alone (no regulariser)"),
    Pretraining("bsl", "mirror", "bsl", None, what="BSL: BYOL-style bootstrapping to an EMA target, no negatives"),
    Pretraining("ct", "mirror", "ct", None, what="Contrastive Tension: two encoder copies, pair dot products, BCE"),
    Pretraining("tsdae", "mirror", "tsdae", None,
                what="TSDAE: rebuild the sentence from one vector after token deletion"),
    Pretraining("mlm", "mirror", "mlm", None, what="masked language modelling"),
    # objectives --preset published: each method at its paper's settings (bertcf.presets)
    Pretraining("simcse-published", "mirror", "simcse", None, what="SimCSE as published", preset="simcse-unsup"),
    Pretraining("mirror-published", "mirror", "mirror", None, what="Mirror-BERT as published", preset="mirror-bert"),
    Pretraining("bsl-published", "mirror", "bsl", None, what="BSL as published", preset="bsl"),
    Pretraining("ct-published", "mirror", "ct", None, what="Contrastive Tension as published", preset="ct"),
    Pretraining("tsdae-published", "mirror", "tsdae", None, what="TSDAE as published", preset="tsdae"),
)}


@dataclass(frozen=True)
class Row:
    name: str                # as in the report
    key: str                 # directory-safe name
    pretraining: str | None  # the Pretraining whose best/ is the row's encoder; None: --model itself


TABLE1_ROWS = (Row("MinBERT", "minbert", None), Row("MinBERT-SimCSE", "simcse", "simcse"),
               Row("MinBERT-Mirror", "mirror", "mirror"), Row("MinBERT-flow", "flow", "flow"),
               Row("BERT-CF", "bertcf", "bertcf"))
ABLATION_ROWS = (Row("SimCSE-joint", "simcse-joint", "simcse-joint"),
                 Row("MinBERT-joint", "minbert-joint", "minbert-joint"),
                 Row("Mirror-flow", "mirror-flow", "mirror-flow"))
OBJECTIVE_ROWS = (Row("MinBERT-BSL", "bsl", "bsl"), Row("MinBERT-CT", "ct", "ct"),
                  Row("MinBERT-TSDAE", "tsdae", "tsdae"), Row("MinBERT-MLM", "mlm", "mlm"))
#: objectives --preset published: every method at its paper's settings (MLM has no preset).
PUBLISHED_ROWS = (Row("SimCSE (published)", "simcse-published", "simcse-published"),
                  Row("Mirror-BERT (published)", "mirror-published", "mirror-published"),
                  Row("BSL (published)", "bsl-published", "bsl-published"),
                  Row("CT (published)", "ct-published", "ct-published"),
                  Row("TSDAE (published)", "tsdae-published", "tsdae-published"), OBJECTIVE_ROWS[-1])
ROW_OF_PRETRAINING = {r.pretraining: r for r in TABLE1_ROWS + ABLATION_ROWS + OBJECTIVE_ROWS + PUBLISHED_ROWS
                      if r.pretraining}

#: mlm-base: MLM pretraining from random weights (--config), whose best/ is then every row's
#: --model; batch 64, lr 5e-4 with a linear warm-up over the first tenth of the steps and a
#: linear decay, 15% masking (80/10/10), the head tied to the word embeddings.
MLM_BASE = Pretraining("mlm-base", "mirror", "mlm", None, what="masked language modelling from random weights")
RANDOM_ROW = Row("Random weights", "random", None)  # mlm-base: the --config encoder itself, untrained


def mlm_base_flags(steps: int) -> list[str]:
    """The base's best/ is chosen by held-out masked-token accuracy: MLM lowers STS at first (the
    anisotropy the report describes), so STS would keep the random step 0."""
    return ["--batch-size", "64", "--lr", "5e-4", "--lr-schedule", "linear", "--warmup-steps", str(max(1, steps // 10)),
            "--select-on", "mlm-heldout"]


@dataclass
class PlannedRun:
    """One run of ``run_pretrain.py`` (a pretraining) or ``run_multitask.py`` (a fine-tuning)."""
    kind: str                       # "pretraining" or "finetune"
    label: str                      # the row it is for, as printed
    dir: Path
    argv: list
    settings: dict
    description: str
    seed: int = 0                   # its --seed
    spec: Pretraining | None = None
    row: Row | None = None
    depends: PlannedRun | None = None  # the pretraining this one starts from
    state: str = "new"              # new | done | resume | restart
    marker: dict = field(default_factory=dict)


def steps_for(stage: str, scale: float) -> int:
    return max(1, round(REPORT_STEPS[stage] * scale))


def abs_if_path(value):
    """Local paths are compared resolved (a hub name is kept as it is)."""
    if value is None:
        return None
    return str(Path(value).resolve()) if Path(value).exists() else str(value)


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def now() -> str:
    return datetime.now().isoformat(timespec="seconds")


def entry_module(kind: str):
    """The module behind a planned run's command: bertcf.pretrain or bertcf.multitask."""
    if kind == "pretraining":
        from .. import pretrain
        return pretrain
    from .. import multitask
    return multitask


class Plan:
    """What one command trains: its rows, every pretraining and fine-tuning run (``pretraining_runs``,
    ``finetune_runs``, each inspected on disk) and their checks, before anything runs."""

    def __init__(self, args, argv=()):
        self.args = args
        self.command = shlex.join(["python", "-m", "bertcf.experiments", *argv])  # as the outputs quote it
        self.out = Path(args.out_dir)
        self.data_dir = Path(args.data_dir)
        self.seeds = args.seeds or [args.seed]
        self.base = MLM_BASE.name if args.command == "mlm-base" else None
        if self.base:  # every row starts from the MLM base (an absolute path: the same before and after it exists)
            args.model = str((self.pretraining_dir(self.base) / "best").resolve())
        self.commands = (list(ALL) if args.command == "all" else ["table1", "ablations"] if self.base
                         else [args.command])
        self.finetune = "table1" in self.commands and not args.no_finetune
        self.ft_scale = args.finetune_steps_scale or args.steps_scale
        self.table1_rows, self.ablation_rows, self.objective_rows = self._select_rows()
        self.device = None

    @property
    def rows(self) -> list[Row]:
        return self.table1_rows + self.ablation_rows + self.objective_rows

    # -- rows and plan ---------------------------------------------------------------------------
    def _select_rows(self):
        table1 = list(TABLE1_ROWS) if {"table1", "analysis"} & set(self.commands) else []
        if self.base:
            table1 = [RANDOM_ROW] + table1
        ablations = list(ABLATION_ROWS) if "ablations" in self.commands else []
        published = self.args.preset == "published"
        objectives = list(PUBLISHED_ROWS if published else OBJECTIVE_ROWS) if "objectives" in self.commands else []
        if self.args.rows:
            wanted = [w.strip().lower() for w in self.args.rows.split(",") if w.strip()]
            offered = table1 + ablations + objectives
            known = {r.name.lower(): r for r in offered} | {r.key: r for r in offered}
            unknown = [w for w in wanted if w not in known]
            if unknown:
                names = ", ".join(r.name for r in offered)
                raise UsageError(f"--rows: {', '.join(unknown)} is not a row of {self.args.command} (rows: {names})")
            chosen = {known[w] for w in wanted}
            table1 = [r for r in table1 if r in chosen]
            ablations = [r for r in ablations if r in chosen]
            objectives = [r for r in objectives if r in chosen]
        return table1, ablations, objectives

    def seed_dir(self, seed: int) -> Path:
        """Where the runs of ``seed`` live: OUT itself for --seed (the directories a one-seed command
        has always used, so adding seeds reuses them), OUT/seeds/<seed> for every other seed."""
        return self.out if seed == self.args.seed else self.out / "seeds" / str(seed)

    def pretraining_dir(self, name: str, seed: int | None = None) -> Path:
        """stages 1 and 2 (the name output directories have always had); the MLM base is shared by every seed."""
        shared = seed is None or name == self.base
        return (self.out if shared else self.seed_dir(seed)) / "stages" / name

    def finetune_dir(self, row: Row, seed: int) -> Path:
        return self.seed_dir(seed) / "finetune" / row.key

    def labelled(self, name: str, seed: int) -> str:
        """A row's name as printed; with several seeds, with its seed."""
        return f"{name} [seed {seed}]" if len(self.seeds) > 1 else name

    def pretraining(self, name: str, seed: int) -> PlannedRun:
        """The planned run of pretraining ``name`` for ``seed`` (the MLM base: the one shared run)."""
        return self.base_run if name == self.base else self.pretraining_runs[seed, name]

    def source_run(self, row: Row, seed: int) -> PlannedRun | None:
        """The pretraining whose best/ is the row's encoder: its own, or the MLM base for the rows that
        use --model (None: --model or --config itself)."""
        if row is RANDOM_ROW:
            return None
        name = row.pretraining or self.base
        return self.pretraining(name, seed) if name else None

    def rel(self, path) -> str:
        try:
            return str(Path(path).relative_to(self.out))
        except ValueError:
            return str(path)

    def encoder_of(self, row: Row, seed: int) -> str:
        """The row's encoder for ``seed``: --model (--config for mlm-base's random row), or its
        pretraining's best/ checkpoint (named explicitly: a run directory also holds a config.json,
        the run's settings)."""
        if row is RANDOM_ROW:
            return self.args.config
        return self.args.model if row.pretraining is None else str(self.pretraining_dir(row.pretraining, seed) / "best")

    def _common(self, model: str, seed: int) -> list[str]:
        a = self.args
        argv = ["--model", model, "--data-dir", str(a.data_dir), "--seed", str(seed)]
        if a.eval_every:
            argv += ["--eval-every", str(a.eval_every)]
        if a.device:
            argv += ["--device", a.device]
        return argv

    def pretraining_run(self, spec: Pretraining, label: str, seed: int) -> PlannedRun:
        a = self.args
        is_base = spec is MLM_BASE
        model = a.config if is_base else a.model
        steps = a.mlm_steps if is_base else steps_for(spec.stage, a.steps_scale)
        flags = mlm_base_flags(steps) + a.mlm_args_list if is_base else list(spec.flags)
        argv = ["--stage", spec.stage, "--method", spec.method]
        if spec.init:
            argv += ["--init", str(self.pretraining_dir(spec.init, seed) / "best")]
        out = self.pretraining_dir(spec.name, seed)
        argv += self._common(model, seed) + ["--out-dir", str(out)]
        if spec.preset:  # the preset sets the length (one epoch of the corpus) and the max length
            argv += ["--preset", spec.preset]
            steps = None
        else:
            argv += ["--steps", str(steps), "--max-length", str(a.max_length)]
        if a.corpus:
            argv += ["--corpus", a.corpus]
        if a.corpus_from_tasks:
            argv += ["--corpus-from-tasks"]
        if a.max_sentences:
            argv += ["--max-sentences", str(a.max_sentences)]
        if a.eval_max_length:
            argv += ["--eval-max-length", str(a.eval_max_length)]
        argv += flags + a.pretrain_args_list
        settings = {"stage": spec.stage, "method": spec.method, "init": spec.init or "--model",
                    "model": abs_if_path(model), "data_dir": abs_if_path(a.data_dir), "steps": steps,
                    "eval_every": a.eval_every, "seed": seed, "max_length": a.max_length,
                    "eval_max_length": a.eval_max_length, "corpus": abs_if_path(a.corpus),
                    "corpus_from_tasks": a.corpus_from_tasks,
                    "max_sentences": a.max_sentences, "flags": flags, "extra_args": a.pretrain_args_list}
        if spec.preset:  # a key of its own, so the settings of every other run stay as they were
            settings |= {"preset": spec.preset, "max_length": None}
        start = (self.rel(self.pretraining_dir(spec.init, seed)) if spec.init else "--config" if is_base
                 else "--model")
        method = f" --method {spec.method}" if spec.stage != "flow" else ""
        shown = f" {' '.join(spec.flags)}" if spec.flags else ""
        length = f"--preset {spec.preset} (one epoch)" if spec.preset else f"{steps} steps"
        description = f"{spec.stage} stage{method}{shown} from {start} -> {self.rel(out)}, {length} ({spec.what})"
        return PlannedRun("pretraining", label, out, argv, settings, description, seed=seed, spec=spec)

    def finetune_run(self, row: Row, seed: int) -> PlannedRun:
        a = self.args
        steps = steps_for("multitask", self.ft_scale)
        out = self.finetune_dir(row, seed)
        argv = ["--encoder", self.encoder_of(row, seed)] + self._common(self.args.model, seed)[2:] + [
            "--out-dir", str(out), "--steps", str(steps)]
        if a.max_train_examples:
            argv += ["--max-train-examples", str(a.max_train_examples)]
        argv += a.finetune_args_list
        settings = {"encoder": row.pretraining or "--model", "model": abs_if_path(a.model),
                    "data_dir": abs_if_path(a.data_dir), "steps": steps, "eval_every": a.eval_every,
                    "seed": seed, "max_train_examples": a.max_train_examples, "extra_args": a.finetune_args_list}
        source = self.rel(self.pretraining_dir(row.pretraining, seed)) if row.pretraining else "--model"
        description = f"multitask fine-tuning of {source} -> {self.rel(out)}, {steps} steps"
        return PlannedRun("finetune", self.labelled(row.name, seed), out, argv, settings, description, seed=seed,
                          row=row, depends=self.source_run(row, seed))

    def runs(self) -> list[PlannedRun]:
        """Every pretraining and fine-tuning run of every seed as a PlannedRun (inspected on disk);
        returns the ones this command runs: the MLM base, then seed by seed, dependencies first."""
        wanted_rows = self.table1_rows + self.ablation_rows + self.objective_rows
        self.base_run = (self.pretraining_run(MLM_BASE, "MLM base (from --config)", self.args.seed)
                         if self.base else None)
        self.pretraining_runs = {(seed, name): self.pretraining_run(spec, ROW_OF_PRETRAINING[name].name, seed)
                                 for seed in self.seeds for name, spec in PRETRAININGS.items()}
        for (seed, name), task in self.pretraining_runs.items():
            init = PRETRAININGS[name].init
            task.depends = self.pretraining_runs[seed, init] if init else self.base_run
        self.finetune_runs = {(seed, row.key): self.finetune_run(row, seed)
                              for seed in self.seeds for row in self.table1_rows}
        every = [self.base_run] if self.base else []
        for t in every + list(self.pretraining_runs.values()) + list(self.finetune_runs.values()):
            self._inspect(t)
        tasks = list(every)

        def need(name: str, seed: int, for_row: Row):
            task = self.pretraining_runs[seed, name]
            if any(t is task for t in tasks):
                return
            if PRETRAININGS[name].init:
                need(PRETRAININGS[name].init, seed, for_row)
            owner = ROW_OF_PRETRAINING[name]
            label = owner.name if owner in wanted_rows else f"{owner.name} (for {for_row.name})"
            task.label = self.labelled(label, seed)
            tasks.append(task)

        for seed in self.seeds:
            for row in wanted_rows:
                if row.pretraining:
                    need(row.pretraining, seed, row)
            if self.finetune:
                tasks += [self.finetune_runs[seed, r.key] for r in self.table1_rows]
        return tasks

    # -- state of a run directory -------------------------------------------------------------------
    _RUN_ENTRIES = {"config.json", "metrics.jsonl", "tb", "best", "last", "predictions", "metrics.json", MARKER}

    def _inspect(self, task: PlannedRun) -> None:
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

    def _problem(self, task: PlannedRun) -> str | None:
        """Why a finished or interrupted run cannot be used as it is: it was started with
        other settings, or from a version of the pretraining it starts from that has changed since."""
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
                return f"{task.dir} was trained from a {self.rel(dep.dir)} that has changed since"
        return None

    def usable(self, task: PlannedRun | None) -> bool:
        """A finished run whose results belong in this command's tables."""
        return task is not None and task.state == "done" and self._problem(task) is None

    def _check(self, task: PlannedRun) -> None:
        problem = self._problem(task)
        if problem:
            raise UsageError(f"{problem}; delete {task.dir} to run it again, or use another --out-dir")
        if task.state == "restart":
            unknown = [p.name for p in task.dir.iterdir()
                       if p.name not in self._RUN_ENTRIES and not p.name.startswith(".")]
            if unknown:
                raise UsageError(f"{task.dir} holds files this command did not write ({', '.join(unknown[:3])}); "
                                 f"move them away or use another --out-dir")

    def input_problems(self, tasks: list[PlannedRun]) -> list[Exception]:
        """What the runs need and cannot find (the data directory, data files, a corpus), each as
        the error that stops the command; a dry run lists them instead."""
        a = self.args
        if not self.data_dir.is_dir():
            return [DataError(f"--data-dir {self.data_dir} is not a directory (see data/README.md)")]
        needed = [task_file(self.data_dir, "sts", "dev")]
        if "analysis" in self.commands:
            needed += [task_file(self.data_dir, "qqp", "train")]
        if self.finetune:
            needed += [task_file(self.data_dir, t, s) for t in TASKS for s in ("train", "dev")]
        problems = []
        if any(t.kind == "pretraining" and t.state != "done" for t in tasks):
            if a.corpus_from_tasks:
                needed += [task_file(self.data_dir, t, "train") for t in TASKS]
            elif a.corpus:
                needed += [Path(a.corpus)]
            elif not (self.data_dir / "wiki1m_for_simcse.txt").is_file():
                problems.append(UsageError(f"no pretraining corpus: give --corpus FILE or --corpus-from-tasks "
                                           f"({self.data_dir / 'wiki1m_for_simcse.txt'} not found)"))
        missing = list(dict.fromkeys(str(p) for p in needed if not Path(p).is_file()))
        if missing:
            problems.append(DataError(f"missing input file(s): {', '.join(missing)} (see data/README.md)"))
        return problems

    def problems(self, tasks: list[PlannedRun]) -> list[Exception]:
        """Everything that would stop the command: missing inputs, runs on disk it cannot use, bad
        flags of a run (parsed now, so a bad --pretrain-args fails before hours of training)."""
        found = self.input_problems(tasks)
        for t in tasks:
            try:
                self._check(t)
                if t.state != "done":
                    self._validate_flags(t)
            except UsageError as e:
                found.append(e)
        return found

    def preflight(self, tasks: list[PlannedRun]) -> None:
        """Stop at the first problem before anything runs."""
        problems = self.problems(tasks)
        if problems:
            raise problems[0]
        self.device = resolve_device(self.args.device)

    def _validate_flags(self, task: PlannedRun) -> None:
        """Parse a run's command line with its own parser."""
        module = entry_module(task.kind)
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                ns = module.build_parser().parse_args(task.argv)
                if task.kind == "pretraining":
                    module.check_args(ns)
        except SystemExit:
            message = stderr.getvalue().strip().splitlines()
            raise UsageError(f"{task.description.split(',')[0]}: {message[-1] if message else 'bad flags'}") from None
        except UsageError as e:
            raise UsageError(f"{task.description.split(',')[0]}: {e}") from None
