"""The plan of one command: every pretraining and fine-tuning run of its rows (``rows``) and seeds
as a ``PlannedRun`` with its command line and its state on disk (finished, interrupted, new),
checked (``checks``) before anything runs."""
from __future__ import annotations

import shlex
from pathlib import Path

from ..errors import UsageError
from ..objectives.presets import PRESETS
from ..utils.precision import resolve_device
from . import checks
from .options import ALL, starts_from_base
from .planned import PlannedRun, abs_if_path
from .rows import (
    ABLATION_ROWS,
    DISTILL_ROWS,
    LEXICAL_ROWS,
    MLM_BASE,
    OBJECTIVE_ROWS,
    PRETRAININGS,
    PUBLISHED_ROWS,
    RANDOM_ROW,
    ROW_OF_PRETRAINING,
    SUPERVISED_ROWS,
    TABLE1_ROWS,
    TEACHER_ROW,
    Pretraining,
    Row,
    distill_flags,
    mlm_base_flags,
    steps_for,
)

def flag_words(values: dict) -> list[str]:
    """``values`` as a command's flags, for the command line a run shows and records."""
    return [word for name, value in values.items()
            for word in ([f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)]))]


class Plan:
    """What one command trains: its rows, every pretraining and fine-tuning run (``pretraining_runs``,
    ``finetune_runs``, each inspected on disk) and their checks, before anything runs."""

    def __init__(self, args, argv=()):
        self.args = args
        self.command = shlex.join(["python", "-m", "bertcf.experiments", *argv])  # as the outputs quote it
        self.out = Path(args.out_dir)
        self.data_dir = Path(args.data_dir)
        self.seeds = args.seeds or [args.seed]
        self.base = MLM_BASE.name if starts_from_base(args) else None  # args.model is then its best/
        self.commands = (list(ALL) if args.command == "all" else ["table1", "ablations"]
                         if args.command == "mlm-base" else [args.command])
        self.finetune = not args.no_finetune and ("table1" in self.commands or args.finetune_ablations)
        self.ft_scale = args.finetune_steps_scale or args.steps_scale
        self.table1_rows, self.ablation_rows, self.objective_rows = self._select_rows()
        # stage 3's rows: table 1's, and the ablations' with --finetune-ablations
        self.finetune_rows = (self.table1_rows + (self.ablation_rows if args.finetune_ablations else [])
                              if self.finetune else [])
        self.lexical_rows = list(LEXICAL_ROWS) if "lexical" in self.commands else []
        self.device = None

    @property
    def rows(self) -> list[Row]:
        return self.table1_rows + self.ablation_rows + self.objective_rows + self.lexical_rows

    # -- rows and plan ---------------------------------------------------------------------------
    def _select_rows(self):
        table1 = list(TABLE1_ROWS) if {"table1", "analysis"} & set(self.commands) else []
        if self.base and table1:
            table1 = [RANDOM_ROW] + table1
        ablations = list(ABLATION_ROWS) if "ablations" in self.commands else []
        published = self.args.preset == "published"
        objectives = list(PUBLISHED_ROWS if published else OBJECTIVE_ROWS) if "objectives" in self.commands else []
        # the command's own rows: a table of their own, beside reference rows (report.REFERENCES)
        objectives += list(SUPERVISED_ROWS) if "supervised" in self.commands else []
        objectives += list(DISTILL_ROWS) if "distill" in self.commands else []
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

    def labelled(self, name: str, seed: int) -> str:  # a row's name as printed; with several seeds, its seed too
        return f"{name} [seed {seed}]" if len(self.seeds) > 1 else name

    def pretraining(self, name: str, seed: int) -> PlannedRun:
        """The planned run of pretraining ``name`` for ``seed`` (the MLM base: the one shared run)."""
        return self.base_run if name == self.base else self.pretraining_runs[seed, name]

    def source_run(self, row: Row, seed: int) -> PlannedRun | None:
        """The pretraining whose best/ is the row's encoder: its own, or the MLM base for the rows that
        use --model (None: --model or --config itself)."""
        if row in (RANDOM_ROW, TEACHER_ROW):
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
        if row is TEACHER_ROW:
            return self.args.teacher
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
        model = a.config if is_base or spec.from_config else a.model
        if is_base or spec.from_config:  # the MLM base's length: the distilled student is its rival
            steps = a.mlm_steps
        elif spec.preset or spec.stage == "whiten":  # a preset sets its own (its epochs); whitening has none
            steps = None
        else:
            steps = steps_for(spec.stage, a.steps_scale)
        flags = mlm_base_flags(steps) + a.mlm_args_list if is_base else list(spec.flags) + self.data_flags(spec, steps)
        out = self.pretraining_dir(spec.name, seed)
        values = self.pretraining_values(spec, seed, model, steps, out)
        words = flags + a.pretrain_args_list  # the row's flags and the user's: words, which run_pretrain.py parses
        corpus = spec.reads_corpus  # not a lexical encoder's word list, nor labelled pairs (--train-file)
        settings = {"stage": spec.stage, "method": spec.method, "init": spec.init or "--model",
                    "model": abs_if_path(model), "data_dir": abs_if_path(a.data_dir), "steps": steps,
                    "eval_every": a.eval_every, "seed": seed,
                    "max_length": None if spec.stage == "whiten" else a.max_length,
                    "eval_max_length": a.eval_max_length, "corpus": abs_if_path(a.corpus) if corpus else None,
                    "corpus_from_tasks": a.corpus_from_tasks and corpus,
                    "max_sentences": a.max_sentences if corpus else None, "flags": flags,
                    "extra_args": a.pretrain_args_list}
        if spec.preset:  # a key of its own, so the settings of every other run stay as they were
            settings |= {"preset": spec.preset, "max_length": None}
        start = (self.rel(self.pretraining_dir(spec.init, seed)) if spec.init else "--config"
                 if is_base or spec.from_config else "--model")
        method = f" --method {spec.method}" if spec.stage not in ("flow", "whiten") else ""
        shown = f" {' '.join(spec.flags)}" if spec.flags else ""
        epochs = PRESETS[spec.preset].epochs if spec.preset else None
        length = (f"--preset {spec.preset} ({epochs:g} epochs of its word list)" if spec.words
                  else f"--preset {spec.preset} ({epochs:g} epoch{'s' if epochs != 1 else ''})" if spec.preset
                  else "closed form, no steps" if spec.stage == "whiten" else f"{steps} steps")
        description = f"{spec.stage} stage{method}{shown} from {start} -> {self.rel(out)}, {length} ({spec.what})"
        return PlannedRun("pretraining", label, out, flag_words(values) + words, settings, description, seed=seed,
                          spec=spec, values=values, words=words)

    def pretraining_values(self, spec: Pretraining, seed: int, model: str, steps: int | None, out: Path) -> dict:
        """The settings the plan gives a pretraining (``PretrainConfig``'s fields, typed), in the order
        its command line shows them: the run is built from them (``planned.pretraining_config``)."""
        a = self.args
        values = {"stage": spec.stage, "method": spec.method}
        if spec.init:
            values["init"] = str(self.pretraining_dir(spec.init, seed) / "best")
        values |= {"model": model, "data_dir": str(a.data_dir), "seed": seed}
        values |= {k: v for k, v in (("eval_every", a.eval_every), ("device", a.device)) if v} | {"out_dir": str(out)}
        if spec.preset:  # the preset sets the length (its epochs of the data) and the max length
            values["preset"] = spec.preset
        elif spec.stage != "whiten":  # a closed-form fit: no steps, no training length
            values |= {"steps": steps, "max_length": a.max_length}
        corpus = ("corpus", a.corpus), ("corpus_from_tasks", a.corpus_from_tasks), ("max_sentences", a.max_sentences)
        values |= {k: v for k, v in corpus if v and spec.reads_corpus}
        values |= {"eval_max_length": a.eval_max_length} if a.eval_max_length else {}
        return values

    def data_flags(self, spec: Pretraining, steps: int | None) -> list[str]:
        """A supervised pretraining's data and teacher: --train-file of the NLI files (sbert-nli,
        simcse-sup; sbert-nli-sts reads --data-dir's STS train file); distill's --teacher, its cache
        (OUT/teacher-cache, shared by the seeds) and the MLM base's optimiser settings."""
        a = self.args
        if spec.method in ("sbert-softmax", "simcse-sup"):
            return ["--train-file", *(abs_if_path(f) for f in a.nli_list)] if a.nli_list else []
        if spec.method == "distill":
            teacher = ["--teacher", abs_if_path(a.teacher)] if a.teacher else []
            return distill_flags(steps) + teacher + ["--teacher-cache", str((self.out / "teacher-cache").resolve())]
        return []

    def finetune_run(self, row: Row, seed: int) -> PlannedRun:
        a = self.args
        steps = steps_for("multitask", self.ft_scale)
        out = self.finetune_dir(row, seed)
        values = {"encoder": self.encoder_of(row, seed), "data_dir": str(a.data_dir), "seed": seed}
        values |= {k: v for k, v in (("eval_every", a.eval_every), ("device", a.device)) if v}
        values |= {"out_dir": str(out), "steps": steps}
        values |= {"max_train_examples": a.max_train_examples} if a.max_train_examples else {}
        words = list(a.finetune_args_list)  # the user's: words, which run_multitask.py parses
        argv = flag_words(values) + words
        settings = {"encoder": row.pretraining or "--model", "model": abs_if_path(a.model),
                    "data_dir": abs_if_path(a.data_dir), "steps": steps, "eval_every": a.eval_every,
                    "seed": seed, "max_train_examples": a.max_train_examples, "extra_args": a.finetune_args_list}
        source = self.rel(self.pretraining_dir(row.pretraining, seed)) if row.pretraining else "--model"
        description = f"multitask fine-tuning of {source} -> {self.rel(out)}, {steps} steps"
        return PlannedRun("finetune", self.labelled(row.name, seed), out, argv, settings, description, seed=seed,
                          row=row, depends=self.source_run(row, seed), values=values, words=words)

    def runs(self) -> list[PlannedRun]:
        """Every pretraining and fine-tuning run of every seed as a PlannedRun (inspected on disk);
        returns the ones this command runs: the MLM base, then seed by seed, dependencies first."""
        wanted_rows = self.rows
        self.base_run = (self.pretraining_run(MLM_BASE, "MLM base (from --config)", self.args.seed)
                         if self.base else None)
        self.pretraining_runs = {(seed, name): self.pretraining_run(spec, ROW_OF_PRETRAINING[name].name, seed)
                                 for seed in self.seeds for name, spec in PRETRAININGS.items()}
        for (seed, name), task in self.pretraining_runs.items():
            init = PRETRAININGS[name].init
            task.depends = (self.pretraining_runs[seed, init] if init else None if PRETRAININGS[name].from_config
                            else self.base_run)
        self.finetune_runs = {(seed, row.key): self.finetune_run(row, seed)
                              for seed in self.seeds for row in self.finetune_rows}
        every = [self.base_run] if self.base else []
        for t in every + list(self.pretraining_runs.values()) + list(self.finetune_runs.values()):
            checks.inspect(t)
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
            tasks += [self.finetune_runs[seed, r.key] for r in self.finetune_rows]
        return tasks

    # -- the runs on disk and what stands in their way (``checks``) ----------------------------------
    def usable(self, task: PlannedRun | None) -> bool:
        """A finished run whose results belong in this command's tables."""
        return task is not None and task.state == "done" and checks.problem(task, self.rel) is None

    def problems(self, tasks: list[PlannedRun]) -> list[Exception]:
        """Everything that would stop the command: missing inputs, runs on disk it cannot use, bad
        flags of a run (parsed now, so a bad --pretrain-args fails before hours of training)."""
        found = checks.input_problems(self, tasks)
        for t in tasks:
            try:
                checks.check(t, self.rel)
                if t.state != "done":
                    checks.validate_flags(t)
            except UsageError as e:
                found.append(e)
        return found

    def preflight(self, tasks: list[PlannedRun]) -> None:
        """Stop at the first problem before anything runs."""
        problems = self.problems(tasks)
        if problems:
            raise problems[0]
        self.device = resolve_device(self.args.device)
