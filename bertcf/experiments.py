"""The report's experiments in one command: table 1, the ablations, the analysis, and the other objectives.

    python -m bertcf.experiments table1     --model DIR --data-dir DIR --out-dir runs/experiments
    python -m bertcf.experiments ablations  ...
    python -m bertcf.experiments analysis   ...
    python -m bertcf.experiments all        ...   (the three, stages trained once)
    python -m bertcf.experiments objectives ...   (not in all: four more pretraining runs)

Encoders (report table 1): MinBERT (``--model`` untouched), MinBERT-SimCSE (mirror stage,
``--method simcse``), MinBERT-Mirror (mirror stage), MinBERT-flow (flow stage on ``--model``),
BERT-CF (joint stage from the Mirror run). Ablations: SimCSE-joint (joint ``--method simcse``
from the SimCSE run), MinBERT-joint (joint ``--unfreeze-encoder`` from ``--model``), Mirror-flow
(flow stage from the Mirror run). Objectives (not in the report, so not part of ``all``):
MinBERT-BSL, -CT, -TSDAE and -MLM (mirror stage, ``--method bsl|ct|tsdae|mlm``, from
``--model``; see bertcf/objectives/), each one more pretraining run, with MinBERT and
MinBERT-Mirror as reference rows (the latter once table1 or all has trained it in ``OUT``).

Every stage is a run of ``bertcf.pretrain`` (``run_pretrain.py``) in ``OUT/stages/<name>/``,
every fine-tuning a run of ``bertcf.multitask`` (``run_multitask.py``) in
``OUT/finetune/<row>/``. A stage shared by several rows is trained once; a finished one
(``experiment.json`` with status ``done``) is reused, an interrupted one is continued with
``--resume``, so rerunning the same command carries on where it stopped. Settings not given
on the command line default to the ones ``OUT`` was started with (``OUT/suite.json``).

Outputs (each written atomically): ``table1.md/json``, ``ablations.md/json``,
``analysis.md/json``, ``qualitative.md``, ``figures/*.png`` and ``tb/`` (TensorBoard:
the cosine histograms and the tables as text); ``objectives.md/json``.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import random
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from . import training
from .cli import ArgumentParser, run_main
from .data import DataError, read_quora, read_sst, read_sts, task_file
from .errors import NonFiniteLossError, UsageError
from .files import atomic_path, recover_dir, save_dir_atomic, write_json_atomic, write_text_atomic
from .precision import resolve_device

# ---- the report ------------------------------------------------------------------------------
#: Report table 1 (bert-base-uncased, dev sets).
REPORT_TABLE1 = {
    "MinBERT": {"sts_spearman": 0.514, "sst_accuracy": 0.512, "qqp_accuracy": 0.821, "sts_pearson": 0.848},
    "MinBERT-SimCSE": {"sts_spearman": 0.745, "sst_accuracy": 0.511, "qqp_accuracy": 0.825, "sts_pearson": 0.852},
    "MinBERT-Mirror": {"sts_spearman": 0.736, "sst_accuracy": 0.522, "qqp_accuracy": 0.820, "sts_pearson": 0.858},
    "MinBERT-flow": {"sts_spearman": 0.517, "sst_accuracy": 0.506, "qqp_accuracy": 0.821, "sts_pearson": 0.857},
    "BERT-CF": {"sts_spearman": 0.760, "sst_accuracy": 0.525, "qqp_accuracy": 0.841, "sts_pearson": 0.857},
}
#: Report ablations, unsupervised STS dev Spearman.
REPORT_ABLATIONS = {"SimCSE-joint": 0.746, "MinBERT-joint": 0.629, "Mirror-flow": 0.739}
#: Report section 6.3: alignment and uniformity on QQP train pairs.
REPORT_ANALYSIS = {
    "MinBERT": {"alignment": 0.216, "uniformity": -1.425},
    "MinBERT-SimCSE": {"alignment": 0.397, "uniformity": -3.264},
    "MinBERT-Mirror": {"alignment": 0.391, "uniformity": -2.990},
    "MinBERT-flow": {"alignment": 0.499, "uniformity": -2.857},
    "BERT-CF": {"alignment": 0.416, "uniformity": -3.198},
}
#: The report's steps per stage; ``--steps-scale`` multiplies them.
REPORT_STEPS = {"mirror": 10_000, "joint": 10_000, "flow": 10_000, "multitask": 5000}

MARKER = "experiment.json"  # in every stage / fine-tuning directory this command runs
SUITE_FILE = "suite.json"   # OUT's settings, the defaults of later invocations
COMMANDS = ("table1", "ablations", "analysis", "objectives", "all")
ALL = ("table1", "ablations", "analysis")  # what ``all`` produces: the report's
#: The settings saved in OUT/suite.json (what the results depend on; not --device, --dry-run...).
SUITE_KEYS = ("model", "data_dir", "corpus", "corpus_from_tasks", "max_sentences", "steps_scale",
              "finetune_steps_scale", "eval_every", "max_train_examples", "max_length", "eval_max_length", "seed",
              "stage_args", "finetune_args", "max_analysis_pairs", "qualitative_pairs")


# ---- what is trained -------------------------------------------------------------------------
@dataclass(frozen=True)
class StageSpec:
    """One run of ``run_pretrain.py`` in OUT/stages/<name>."""
    name: str
    stage: str              # mirror | joint | flow
    method: str
    init: str | None        # another StageSpec's name, or None for --model
    flags: tuple = ()
    what: str = ""


STAGES = {s.name: s for s in (
    StageSpec("simcse", "mirror", "simcse", None, what="SimCSE pretraining (dropout only)"),
    StageSpec("mirror", "mirror", "mirror", None, what="Mirror-BERT pretraining (dropout + span masking)"),
    StageSpec("flow", "flow", "flow", None, what="flow on L_flow alone, encoder frozen"),
    StageSpec("bertcf", "joint", "mirror", "mirror", what="joint flow + 0.3 L_mirror, encoder frozen"),
    StageSpec("simcse-joint", "joint", "simcse", "simcse", what="joint flow + 0.3 L_simcse, encoder frozen"),
    StageSpec("minbert-joint", "joint", "mirror", None, ("--unfreeze-encoder",),
              what="joint flow + 0.3 L_mirror, encoder unfrozen"),
    StageSpec("mirror-flow", "flow", "flow", "mirror", what="flow on L_flow alone (no regulariser)"),
    StageSpec("bsl", "mirror", "bsl", None, what="BSL: BYOL-style bootstrapping to an EMA target, no negatives"),
    StageSpec("ct", "mirror", "ct", None, what="Contrastive Tension: two encoder copies, pair dot products, BCE"),
    StageSpec("tsdae", "mirror", "tsdae", None, what="TSDAE: rebuild the sentence from one vector after token deletion"),
    StageSpec("mlm", "mirror", "mlm", None, what="masked language modelling"),
)}


@dataclass(frozen=True)
class Row:
    name: str               # as in the report
    key: str                # directory-safe name
    stage: str | None       # the StageSpec whose best/ is the row's encoder; None: --model itself


TABLE1_ROWS = (Row("MinBERT", "minbert", None), Row("MinBERT-SimCSE", "simcse", "simcse"),
               Row("MinBERT-Mirror", "mirror", "mirror"), Row("MinBERT-flow", "flow", "flow"),
               Row("BERT-CF", "bertcf", "bertcf"))
ABLATION_ROWS = (Row("SimCSE-joint", "simcse-joint", "simcse-joint"),
                 Row("MinBERT-joint", "minbert-joint", "minbert-joint"),
                 Row("Mirror-flow", "mirror-flow", "mirror-flow"))
OBJECTIVE_ROWS = (Row("MinBERT-BSL", "bsl", "bsl"), Row("MinBERT-CT", "ct", "ct"),
                  Row("MinBERT-TSDAE", "tsdae", "tsdae"), Row("MinBERT-MLM", "mlm", "mlm"))
ROW_OF_STAGE = {r.stage: r for r in TABLE1_ROWS + ABLATION_ROWS + OBJECTIVE_ROWS if r.stage}
HISTOGRAM_ROWS = ("MinBERT", "BERT-CF")  # the report's appendix figures

#: Our key -> its name in the multitask stage's metrics.json (multitask.METRICS and
#: multitask.SELECTION_METRIC).
FINETUNE_METRICS = {"sst_accuracy": "sst_acc", "qqp_accuracy": "para_acc", "sts_pearson": "sts_pearson",
                    "mean_dev": "mean_dev"}


class Interrupted(Exception):
    """A stage stopped on Ctrl-C (its state is saved); rerunning the command continues it."""


# ---- command line ------------------------------------------------------------------------------
def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m bertcf.experiments", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=COMMANDS,
                   help="what to produce (all: table1, ablations and analysis; objectives is run on its own)")
    p.add_argument("--model", default="bert-base-uncased", help="the BERT every encoder starts from (default %(default)s)")
    p.add_argument("--data-dir", default="data", help="CS224N files (default %(default)s)")
    p.add_argument("--out-dir", default="runs/experiments", help="everything goes here (default %(default)s)")
    g = p.add_argument_group("pretraining corpus (passed to every stage)")
    g.add_argument("--corpus", default=None, help="one sentence per line (default: DATA_DIR/wiki1m_for_simcse.txt)")
    g.add_argument("--corpus-from-tasks", action="store_true", help="the unlabeled sentences of the task train files")
    g.add_argument("--max-sentences", type=int, default=None, help="use at most this many corpus sentences")
    g = p.add_argument_group("scale")
    g.add_argument("--steps-scale", type=float, default=1.0,
                   help="multiplies the report's steps (stages 10^4 each, multitask 5000); default %(default)s")
    g.add_argument("--finetune-steps-scale", type=float, default=None,
                   help="multiplies the report's 5000 multitask steps (default: --steps-scale)")
    g.add_argument("--eval-every", type=int, default=None, help="passed to every run (default: each stage's own)")
    g.add_argument("--max-train-examples", type=int, default=None, help="passed to every fine-tuning run")
    g.add_argument("--max-length", type=int, default=32,
                   help="tokens per sentence in the stages' training (default %(default)s)")
    g.add_argument("--eval-max-length", type=int, default=None,
                   help="tokens per sentence in every unsupervised evaluation: the stages' best-checkpoint choice, "
                        "the unsupervised column, analysis and qualitative tables (default: the model's "
                        "max_position_embeddings, i.e. whole sentences)")
    g.add_argument("--seed", type=int, default=11711)
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    g.add_argument("--stage-args", default="", help="more flags for every run_pretrain.py run, e.g. '--batch-size 32'")
    g.add_argument("--finetune-args", default="", help="more flags for every run_multitask.py run")
    g = p.add_argument_group("what to run")
    g.add_argument("--rows", default=None,
                   help="comma-separated rows to run (names or keys, e.g. MinBERT,BERT-CF; default: all of the command's)")
    g.add_argument("--no-finetune", action="store_true", help="table1: no multitask fine-tuning (unsupervised column only)")
    g.add_argument("--max-analysis-pairs", type=int, default=5000,
                   help="analysis: QQP train pairs sampled for alignment/uniformity (0: all; default %(default)s)")
    g.add_argument("--qualitative-pairs", type=int, default=10, help="examples in each qualitative table")
    g.add_argument("--dry-run", action="store_true", help="print the plan and the stage commands, run nothing")
    g = p.add_argument_group("SentEval (when its STS files are there)")
    g.add_argument("--senteval-dir", default=None,
                   help="SentEval's data: adds the STS test average to table1/ablations (default DATA_DIR/SentEval)")
    g.add_argument("--transfer", action="store_true", help="also the transfer tasks' average (fasttest) in table1")
    return p


def parse_args(argv=None):
    """Parse flags; the settings of SUITE_KEYS not given default to OUT/suite.json's."""
    parser = build_parser()
    args = parser.parse_args(argv)
    suite = Path(args.out_dir) / SUITE_FILE
    args.saved_settings = None
    if suite.is_file():
        try:
            saved = json.loads(suite.read_text())["settings"]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{suite} is not a settings file written by this command") from None
        parser.set_defaults(**{k: v for k, v in saved.items() if k in SUITE_KEYS})
        args = parser.parse_args(argv)
        args.saved_settings = saved
    if args.steps_scale <= 0 or not math.isfinite(args.steps_scale):
        raise UsageError(f"--steps-scale must be positive, not {args.steps_scale}")
    if args.finetune_steps_scale is not None and not args.finetune_steps_scale > 0:
        raise UsageError(f"--finetune-steps-scale must be positive, not {args.finetune_steps_scale}")
    for name in ("eval_every", "max_train_examples", "max_sentences", "max_length", "eval_max_length",
                 "qualitative_pairs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    if args.max_analysis_pairs < 0:
        raise UsageError(f"--max-analysis-pairs must be >= 0, not {args.max_analysis_pairs}")
    if args.corpus and args.corpus_from_tasks:
        raise UsageError("give either --corpus or --corpus-from-tasks, not both")
    for name in ("stage_args", "finetune_args"):
        try:
            setattr(args, name + "_list", shlex.split(getattr(args, name)))
        except ValueError as e:
            raise UsageError(f"--{name.replace('_', '-')}: {e}") from None
    return args


# ---- small helpers -------------------------------------------------------------------------------
def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def now() -> str:
    return datetime.now().isoformat(timespec="seconds")


def fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def md_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule] + rows
    return "".join("| " + " | ".join(str(c) for c in line) + " |\n" for line in lines)


def md_cell(text: str, limit: int = 90) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def steps_for(stage: str, scale: float) -> int:
    return max(1, round(REPORT_STEPS[stage] * scale))


def _abs_if_path(value):
    """Local paths are compared resolved (a hub name is kept as it is)."""
    if value is None:
        return None
    return str(Path(value).resolve()) if Path(value).exists() else str(value)


def finetune_metrics(metrics: dict) -> dict:
    """Our four supervised keys from a multitask metrics.json (None where one is missing)."""
    return {ours: None if metrics.get(name) is None else float(metrics[name])
            for ours, name in FINETUNE_METRICS.items()}


def read_predictions(path) -> dict[str, str]:
    """A CS224N prediction file (a header, then ``id , prediction`` lines) -> {id: prediction}."""
    out = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines[1:]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0]:
            out[parts[0]] = parts[-1]
    return out


# ---- analysis maths ----------------------------------------------------------------------------------
def pair_analysis(encoder, pairs, batch_size: int = 64) -> dict:
    """Alignment over the positive pairs (label 1) and uniformity over every distinct sentence
    of ``pairs`` (report section 6.3, on QQP train pairs)."""
    import torch

    from .evaluation import alignment, uniformity

    sentences = list(dict.fromkeys(s for p in pairs for s in (p.sentence1, p.sentence2)))
    index = {s: i for i, s in enumerate(sentences)}
    vectors = encoder.encode(sentences, batch_size=batch_size)
    positives = [p for p in pairs if p.label == 1]
    if positives:
        x = vectors[torch.tensor([index[p.sentence1] for p in positives])]
        y = vectors[torch.tensor([index[p.sentence2] for p in positives])]
        align = alignment(x, y)
    else:
        align = float("nan")
    unif = uniformity(vectors) if len(sentences) > 1 else float("nan")
    return {"alignment": align, "uniformity": unif, "pairs": len(pairs), "positives": len(positives),
            "sentences": len(sentences)}


# ---- the suite --------------------------------------------------------------------------------------
@dataclass
class Task:
    kind: str                       # "stage" or "finetune"
    label: str                      # the row it is for, as printed
    dir: Path
    argv: list
    settings: dict
    description: str
    spec: StageSpec | None = None
    row: Row | None = None
    depends: str | None = None      # the stage this one starts from
    state: str = "new"              # new | done | resume | restart
    marker: dict = field(default_factory=dict)


class Suite:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out_dir)
        self.data_dir = Path(args.data_dir)
        self.commands = list(ALL) if args.command == "all" else [args.command]
        self.finetune = "table1" in self.commands and not args.no_finetune
        self.ft_scale = args.finetune_steps_scale or args.steps_scale
        self.table1_rows, self.ablation_rows, self.objective_rows = self._select_rows()
        self.device = None
        self.outputs: list[str] = []
        self.started = time.perf_counter()

    # -- rows and plan ---------------------------------------------------------------------------
    def _select_rows(self):
        table1 = list(TABLE1_ROWS) if {"table1", "analysis"} & set(self.commands) else []
        ablations = list(ABLATION_ROWS) if "ablations" in self.commands else []
        objectives = list(OBJECTIVE_ROWS) if "objectives" in self.commands else []
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

    def stage_dir(self, name: str) -> Path:
        return self.out / "stages" / name

    def finetune_dir(self, row: Row) -> Path:
        return self.out / "finetune" / row.key

    def rel(self, path) -> str:
        try:
            return str(Path(path).relative_to(self.out))
        except ValueError:
            return str(path)

    def encoder_of(self, row: Row) -> str:
        """The row's encoder: --model, or its stage's best/ checkpoint (named explicitly: a run
        directory also holds a config.json, the run's settings)."""
        return self.args.model if row.stage is None else str(self.stage_dir(row.stage) / "best")

    def _common(self) -> list[str]:
        a = self.args
        argv = ["--model", a.model, "--data-dir", str(a.data_dir), "--seed", str(a.seed)]
        if a.eval_every:
            argv += ["--eval-every", str(a.eval_every)]
        if a.device:
            argv += ["--device", a.device]
        return argv

    def stage_task(self, spec: StageSpec, label: str) -> Task:
        a = self.args
        steps = steps_for(spec.stage, a.steps_scale)
        argv = ["--stage", spec.stage, "--method", spec.method]
        if spec.init:
            argv += ["--init", str(self.stage_dir(spec.init) / "best")]
        argv += self._common() + ["--out-dir", str(self.stage_dir(spec.name)), "--steps", str(steps),
                                  "--max-length", str(a.max_length)]
        if a.corpus:
            argv += ["--corpus", a.corpus]
        if a.corpus_from_tasks:
            argv += ["--corpus-from-tasks"]
        if a.max_sentences:
            argv += ["--max-sentences", str(a.max_sentences)]
        if a.eval_max_length:
            argv += ["--eval-max-length", str(a.eval_max_length)]
        argv += list(spec.flags) + a.stage_args_list
        settings = {"stage": spec.stage, "method": spec.method, "init": spec.init or "--model",
                    "model": _abs_if_path(a.model), "data_dir": _abs_if_path(a.data_dir), "steps": steps,
                    "eval_every": a.eval_every, "seed": a.seed, "max_length": a.max_length,
                    "eval_max_length": a.eval_max_length, "corpus": _abs_if_path(a.corpus),
                    "corpus_from_tasks": a.corpus_from_tasks,
                    "max_sentences": a.max_sentences, "flags": list(spec.flags), "extra_args": a.stage_args_list}
        start = f"stages/{spec.init}" if spec.init else "--model"
        method = f" --method {spec.method}" if spec.stage != "flow" else ""
        flags = f" {' '.join(spec.flags)}" if spec.flags else ""
        description = (f"{spec.stage} stage{method}{flags} from {start} -> stages/{spec.name}, "
                       f"{steps} steps ({spec.what})")
        return Task("stage", label, self.stage_dir(spec.name), argv, settings, description, spec=spec,
                    depends=spec.init)

    def finetune_task(self, row: Row) -> Task:
        a = self.args
        steps = steps_for("multitask", self.ft_scale)
        argv = ["--encoder", self.encoder_of(row)] + self._common()[2:] + [
            "--out-dir", str(self.finetune_dir(row)), "--steps", str(steps)]
        if a.max_train_examples:
            argv += ["--max-train-examples", str(a.max_train_examples)]
        argv += a.finetune_args_list
        settings = {"encoder": row.stage or "--model", "model": _abs_if_path(a.model),
                    "data_dir": _abs_if_path(a.data_dir), "steps": steps, "eval_every": a.eval_every,
                    "seed": a.seed, "max_train_examples": a.max_train_examples, "extra_args": a.finetune_args_list}
        source = f"stages/{row.stage}" if row.stage else "--model"
        description = f"multitask fine-tuning of {source} -> finetune/{row.key}, {steps} steps"
        return Task("finetune", row.name, self.finetune_dir(row), argv, settings, description, row=row,
                    depends=row.stage)

    def plan(self) -> list[Task]:
        """Every stage and fine-tuning as a Task (inspected on disk); returns the ones this
        command runs, dependencies first."""
        wanted_rows = self.table1_rows + self.ablation_rows + self.objective_rows
        self.stage_tasks = {name: self.stage_task(spec, ROW_OF_STAGE[name].name) for name, spec in STAGES.items()}
        self.finetune_tasks = {row.key: self.finetune_task(row) for row in TABLE1_ROWS}
        for t in list(self.stage_tasks.values()) + list(self.finetune_tasks.values()):
            self._inspect(t)
        tasks = []

        def need(stage: str, for_row: Row):
            task = self.stage_tasks[stage]
            if any(t is task for t in tasks):
                return
            if STAGES[stage].init:
                need(STAGES[stage].init, for_row)
            owner = ROW_OF_STAGE[stage]
            task.label = owner.name if owner in wanted_rows else f"{owner.name} (for {for_row.name})"
            tasks.append(task)

        for row in wanted_rows:
            if row.stage:
                need(row.stage, row)
        if self.finetune:
            tasks += [self.finetune_tasks[r.key] for r in self.table1_rows]
        self.scheduled = tasks
        return tasks

    # -- state of a run directory -------------------------------------------------------------------
    _RUN_ENTRIES = {"config.json", "metrics.jsonl", "tb", "best", "last", "predictions", "metrics.json", MARKER}

    def _inspect(self, task: Task) -> None:
        """Set task.state: done (finished, reuse), resume (continue from last/), restart
        (an attempt that left no checkpoint: cleared and started again) or new."""
        d = task.dir
        task.marker = read_json(d / MARKER) or {}
        if task.marker.get("status") == "done":
            task.state = "done"
            return
        last = recover_dir(d / "last") if d.exists() else d / "last"
        if (last / training.STATE_FILE).is_file():
            task.state = "resume"
        elif d.exists() and any(d.iterdir()):
            task.state = "restart"
        else:
            task.state = "new"

    def _problem(self, task: Task) -> str | None:
        """Why a finished or interrupted run cannot be used as it is: it was started with
        other settings, or from a version of its starting stage that has changed since."""
        if task.state not in ("done", "resume"):
            return None
        if task.marker.get("settings") is not None:
            old, new = task.marker["settings"], json.loads(json.dumps(task.settings))
            diff = [f"{k}={old.get(k)!r} (now {new.get(k)!r})" for k in sorted(set(old) | set(new))
                    if old.get(k) != new.get(k)]
            if diff:
                return f"{task.dir} was started with other settings: {', '.join(diff)}"
        if task.depends:
            dep = self.stage_tasks[task.depends]
            dep_finished = dep.marker.get("finished") if dep.state == "done" else None
            if task.marker.get("init_finished") not in (None, dep_finished):
                return f"{task.dir} was trained from a stages/{task.depends} that has changed since"
        return None

    def usable(self, task: Task | None) -> bool:
        """A finished run whose results belong in this command's tables."""
        return task is not None and task.state == "done" and self._problem(task) is None

    def _check(self, task: Task) -> None:
        problem = self._problem(task)
        if problem:
            raise UsageError(f"{problem}; delete {task.dir} to run it again, or use another --out-dir")
        if task.state == "restart":
            unknown = [p.name for p in task.dir.iterdir()
                       if p.name not in self._RUN_ENTRIES and not p.name.startswith(".")]
            if unknown:
                raise UsageError(f"{task.dir} holds files this command did not write ({', '.join(unknown[:3])}); "
                                 f"move them away or use another --out-dir")

    def preflight(self, tasks: list[Task]) -> None:
        a = self.args
        if not self.data_dir.is_dir():
            raise DataError(f"--data-dir {self.data_dir} is not a directory (see data/README.md)")
        needed = [task_file(self.data_dir, "sts", "dev")]
        if "analysis" in self.commands:
            needed += [task_file(self.data_dir, "quora", "train")]
        if self.finetune:
            needed += [task_file(self.data_dir, t, s) for t in ("sst", "quora", "sts") for s in ("train", "dev")]
        pretraining = any(t.kind == "stage" and t.state != "done" for t in tasks)
        if pretraining:
            if a.corpus_from_tasks:
                needed += [task_file(self.data_dir, t, "train") for t in ("sst", "quora", "sts")]
            elif a.corpus:
                needed += [Path(a.corpus)]
            elif not (self.data_dir / "wiki1m_for_simcse.txt").is_file():
                raise UsageError(f"no pretraining corpus: give --corpus FILE or --corpus-from-tasks "
                                 f"({self.data_dir / 'wiki1m_for_simcse.txt'} not found)")
        missing = list(dict.fromkeys(str(p) for p in needed if not Path(p).is_file()))
        if missing:
            raise DataError(f"missing input file(s): {', '.join(missing)} (see data/README.md)")
        for t in tasks:
            self._check(t)
            if t.state != "done":
                self._validate_flags(t)
        self.device = resolve_device(a.device)

    def _validate_flags(self, task: Task) -> None:
        """Parse a run's command line with its own parser now, so a bad --stage-args fails
        before hours of training instead of after."""
        module = self._pretrain() if task.kind == "stage" else self._multitask()
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                ns = module.build_parser().parse_args(task.argv)
                if task.kind == "stage":
                    module.check_args(ns)
        except SystemExit:
            message = stderr.getvalue().strip().splitlines()
            raise UsageError(f"{task.description.split(',')[0]}: {message[-1] if message else 'bad flags'}") from None
        except UsageError as e:
            raise UsageError(f"{task.description.split(',')[0]}: {e}") from None

    @staticmethod
    def _pretrain():
        from . import pretrain
        return pretrain

    @staticmethod
    def _multitask():
        from . import multitask
        return multitask

    # -- running -------------------------------------------------------------------------------------
    def command_line(self, task: Task) -> str:
        script = "run_pretrain.py" if task.kind == "stage" else "run_multitask.py"
        resume = ["--resume"] if task.state == "resume" else []
        return shlex.join(["python", script] + task.argv + resume)

    def execute(self, tasks: list[Task]) -> None:
        n = len(tasks)
        for i, task in enumerate(tasks, 1):
            head = f"[{i}/{n}] {task.label}: {task.description}"
            if task.state == "done":
                print(f"{head}: finished earlier, reused", flush=True)
                continue
            note = {"resume": " (continuing the interrupted run)",
                    "restart": " (the interrupted attempt left no checkpoint: starting it again)"}.get(task.state, "")
            print(head + note, flush=True)
            self.run_task(task)

    def run_task(self, task: Task) -> None:
        if task.state == "restart":
            shutil.rmtree(task.dir)
        task.dir.mkdir(parents=True, exist_ok=True)
        dep = self.stage_tasks.get(task.depends) if task.depends else None
        marker = {"status": "running", "kind": task.kind, "row": task.label, "settings": task.settings,
                  "argv": task.argv, "command": self.command_line(task),
                  "init_finished": (dep.marker.get("finished") if dep else None),
                  "started": task.marker.get("started", now()) if task.state == "resume" else now(),
                  "wall_s": task.marker.get("wall_s", 0.0) if task.state == "resume" else 0.0}
        write_json_atomic(task.dir / MARKER, marker)
        argv = task.argv + (["--resume"] if task.state == "resume" else [])
        entry = (self._pretrain() if task.kind == "stage" else self._multitask()).main
        what = f"{task.label} ({self.rel(task.dir)})"
        tick = time.perf_counter()
        try:
            result = entry(argv)
        except SystemExit as e:
            if e.code not in (0, None):
                raise UsageError(f"{what}: the run stopped with exit status {e.code}") from None
            result = None
        except (UsageError, DataError, NonFiniteLossError) as e:
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
            raise Interrupted(f"{what} was interrupted")
        if not (task.dir / "best").is_dir():
            raise UsageError(f"{what}: the run finished without a best/ checkpoint")
        marker |= {"status": "done", "finished": now(), "summary": summary}
        write_json_atomic(task.dir / MARKER, marker)
        task.marker, task.state = marker, "done"

    # -- evaluation (cached per encoder) --------------------------------------------------------------------
    def _stamp(self, row: Row):
        if row.stage is None:
            return {"model": _abs_if_path(self.args.model)}
        return {"stage": row.stage, "finished": self.stage_tasks[row.stage].marker.get("finished")}

    def _cached(self, name: str, key: dict, compute):
        path = self.out / "eval" / f"{name}.json"
        key = json.loads(json.dumps(key))
        cached = read_json(path)
        if cached and cached.get("key") == key:
            return cached["value"]
        value = compute()
        write_json_atomic(path, {"key": key, "value": value})
        return value

    def _load_encoder(self, row: Row):
        from .encoder import SentenceEncoder
        encoder = SentenceEncoder.from_pretrained(self.encoder_of(row))
        encoder.max_length = self.args.eval_max_length or encoder.bert.config.max_position_embeddings
        return encoder.to(self.device).eval()

    def evaluate_rows(self, rows: list[Row], analysis: bool) -> dict:
        """{row.key: {"sts": evaluate_sts result (cosines as a list), "qqp": pair_analysis}}."""
        from .evaluation import evaluate_sts

        a = self.args
        sts_dev = read_sts(task_file(self.data_dir, "sts", "dev"))
        qqp = self._analysis_pairs() if analysis else None
        results = {}
        for row in rows:
            if row.stage and not self.usable(self.stage_tasks[row.stage]):
                continue
            stamp = self._stamp(row) | {"eval_max_length": a.eval_max_length or "model",
                                        "data_dir": _abs_if_path(a.data_dir)}
            encoder = None

            def load():
                nonlocal encoder
                if encoder is None:
                    print(f"evaluating {row.name} ({self.rel(self.encoder_of(row))})", flush=True)
                    encoder = self._load_encoder(row)
                return encoder

            def sts():
                r = evaluate_sts(load(), sts_dev)
                return r | {"cosines": r["cosines"].tolist()}

            out = {"sts": self._cached(f"{row.key}-sts-dev", stamp, sts)}
            if self.senteval_tasks:
                key = self._stamp(row) | {"senteval_dir": _abs_if_path(self.senteval_dir), "tasks": self.senteval_tasks}
                out["senteval"] = self._cached(f"{row.key}-senteval", key, lambda: self._senteval(load()))
            if analysis:
                key = stamp | {"max_analysis_pairs": a.max_analysis_pairs, "seed": a.seed}
                out["qqp"] = self._cached(f"{row.key}-qqp-train", key, lambda: pair_analysis(load(), qqp))
            results[row.key] = out
            del encoder
        return results

    @property
    def senteval_dir(self) -> Path:
        return Path(self.args.senteval_dir or self.data_dir / "SentEval")

    @property
    def senteval_tasks(self) -> list[str]:
        """The SentEval tasks whose files are there: STS (test sets), + transfer with --transfer."""
        from .evaluate import present_tasks
        from .senteval import STS_TASKS, TRANSFER_TASKS
        sts = present_tasks(self.senteval_dir, STS_TASKS)
        return sts + present_tasks(self.senteval_dir, TRANSFER_TASKS) if sts and self.args.transfer else sts

    def _senteval(self, encoder) -> dict:
        from .evaluate import evaluate
        mode = "fasttest" if self.args.transfer else "test"  # STS is the same in both modes
        return evaluate(encoder, self.senteval_dir, self.senteval_tasks, mode)

    def senteval_columns(self, results: dict, rows: list[Row]) -> tuple[list[str], dict]:
        """The optional columns: the STS test average ("7 STS avg (test)" when all seven are
        there) and, with --transfer, the transfer average; {row key: cells}."""
        found = {r.key: results[r.key]["senteval"] for r in rows if (results.get(r.key) or {}).get("senteval")}
        if not found:
            return [], {}
        n = len(next(iter(found.values()))["sts"])
        header = ["7 STS avg (test)" if n == 7 else f"STS avg (test, {n} sets)"]
        header += ["Transfer avg (fasttest)"] if self.args.transfer else []
        cells = {k: [fmt(v["sts_avg"], 2)] + ([fmt(v["transfer_avg"], 2)] if self.args.transfer else [])
                 for k, v in found.items()}
        return header, cells

    def _analysis_pairs(self):
        pairs = read_quora(task_file(self.data_dir, "quora", "train"))
        k = self.args.max_analysis_pairs
        if k and k < len(pairs):
            pairs = random.Random(self.args.seed).sample(pairs, k)
        return pairs

    def finetune_results(self, row: Row) -> dict | None:
        task = self.finetune_tasks.get(row.key)
        if not self.usable(task):
            return None
        metrics = read_json(task.dir / "metrics.json")
        return finetune_metrics(metrics) if isinstance(metrics, dict) else None

    # -- outputs -------------------------------------------------------------------------------------------
    def settings_md(self) -> str:
        a = self.args
        steps = {s: steps_for(s, a.steps_scale) for s in ("mirror", "joint", "flow")}
        corpus = a.corpus or ("the task train files" if a.corpus_from_tasks else f"{a.data_dir}/wiki1m_for_simcse.txt")
        lines = [f"- model: `{a.model}` (the report: bert-base-uncased)",
                 f"- data: `{a.data_dir}`; pretraining corpus: {corpus}"
                 + (f", first {a.max_sentences} sentences" if a.max_sentences else "") + " (the report: Wiki1M)",
                 f"- steps: mirror {steps['mirror']}, joint {steps['joint']}, flow {steps['flow']}, "
                 f"multitask {steps_for('multitask', self.ft_scale)} (the report: 10^4, 10^4, 10^4, 5000)",
                 f"- seed {a.seed}, device {self.device}, max length {a.max_length} in training, "
                 f"{a.eval_max_length or 'whole sentences'} in evaluation"]
        if a.stage_args:
            lines.append(f"- extra flags of every stage: `{a.stage_args}`")
        if a.finetune_args:
            lines.append(f"- extra flags of every fine-tuning: `{a.finetune_args}`")
        if a.max_train_examples:
            lines.append(f"- fine-tuning on at most {a.max_train_examples} training examples per task")
        return "\n".join(lines) + "\n"

    def command_md(self) -> str:
        return f"Command: `{shlex.join(['python', '-m', 'bertcf.experiments'] + list(self.argv))}`\n"

    def write(self, name: str, text: str) -> None:
        write_text_atomic(self.out / name, text)
        self.outputs.append(str(self.out / name))

    def write_json(self, name: str, obj) -> None:
        write_json_atomic(self.out / name, obj)
        self.outputs.append(str(self.out / name))

    def _stage_info(self, row: Row) -> dict:
        if row.stage is None:
            return {"encoder": self.args.model}
        t = self.stage_tasks[row.stage]
        s = t.marker.get("summary") or {}
        return {"encoder": str(t.dir / "best"), "stage_best_sts_spearman": s.get("best"),
                "stage_best_step": s.get("best_step"), "stage_wall_s": t.marker.get("wall_s")}

    def write_table1(self, results: dict) -> dict:
        rows_json, md_rows = [], []
        for row in self.table1_rows:
            r = results.get(row.key)
            ours = {"sts_spearman": r["sts"]["sts_spearman"] if r else None}
            ft = self.finetune_results(row)
            ours |= ft or {k: None for k in FINETUNE_METRICS}
            report = REPORT_TABLE1[row.name]
            info = self._stage_info(row)
            ft_task = self.finetune_tasks.get(row.key)
            if ft is not None:
                info |= {"finetune_dir": str(ft_task.dir), "finetune_wall_s": ft_task.marker.get("wall_s")}
            rows_json.append({"name": row.name, "ours": ours, "report": report} | info)
            md_rows.append([row.name] + [c for k in ("sts_spearman", "sst_accuracy", "qqp_accuracy", "sts_pearson")
                                         for c in (fmt(ours[k]), fmt(report[k]))])
        header = ["Encoder", "Unsup. STS ρ", "(report)", "SST-5 acc", "(report)", "QQP acc", "(report)",
                  "STS r", "(report)"]
        extra, cells = self.senteval_columns(results, self.table1_rows)
        header += extra
        md_rows = [r + cells.get(row.key, ["–"] * len(extra)) for r, row in zip(md_rows, self.table1_rows)]
        for r, row in zip(rows_json, self.table1_rows):
            r["ours"]["senteval"] = (results.get(row.key) or {}).get("senteval")
        md = ("# Table 1: sentence encoders on the CS224N dev sets\n\n"
              "Unsupervised STS ρ: Spearman of cos(f(x1), f(x2)) with the STS dev scores, before fine-tuning. "
              "SST-5 / QQP accuracy and STS Pearson r: after multitask fine-tuning of each encoder. "
              "(report) = the report's number (bert-base-uncased).\n\n"
              + md_table(header, md_rows) + "\n## Settings\n\n" + self.settings_md() + "\n" + self.command_md())
        if not self.finetune and all(r["ours"]["sst_accuracy"] is None for r in rows_json):
            md += "\nFine-tuning was not run (--no-finetune): the supervised columns are empty.\n"
        obj = {"rows": rows_json, "settings": self.settings_json(), "command": self.argv}
        self.write("table1.md", md)
        self.write_json("table1.json", obj)
        return obj

    def write_ablations(self, results: dict) -> dict:
        return self.write_sts_table("ablations", "Ablations: unsupervised STS dev Spearman", "", "Variant",
                                    self.ablation_rows, REPORT_ABLATIONS, [TABLE1_ROWS[-1]], results)

    def write_objectives(self, results: dict) -> dict:
        text = ("Other self-supervised objectives in the first pretraining stage (`--stage mirror "
                "--method bsl|ct|tsdae|mlm`), each from --model with the same corpus, steps and choice "
                "of the best STS-dev checkpoint as MinBERT-Mirror. The report has no numbers for these "
                "(it trains Mirror-BERT and SimCSE only), so their (report) cells are empty.\n\n")
        return self.write_sts_table("objectives", "Pretraining objectives: unsupervised STS dev Spearman", text,
                                    "Encoder", self.objective_rows, {}, [TABLE1_ROWS[0], TABLE1_ROWS[2]], results)

    def write_sts_table(self, name: str, title: str, text: str, first: str, rows: list[Row], report: dict,
                        references: list[Row], results: dict) -> dict:
        """NAME.md/json: each row's unsupervised STS dev Spearman beside the report's (``report``:
        by row name; a row not in it has none), then those of the ``references`` (table 1 rows,
        with the report's table 1 number) whose encoder is there."""
        def entry(row: Row, r: dict | None, report_value) -> dict:
            return {"name": row.name, "what": STAGES[row.stage].what if row.stage else "--model, untouched",
                    "ours": {"sts_spearman": r["sts"]["sts_spearman"] if r else None},
                    "report": {"sts_spearman": report_value}} | self._stage_info(row)

        rows_json = [entry(row, results.get(row.key), report.get(row.name)) for row in rows]
        present = [r for r in references if r.stage is None or self.usable(self.stage_tasks[r.stage])]
        ref_results = self.evaluate_rows([r for r in present if r.key not in results], analysis=False)
        refs_json = [entry(row, results.get(row.key) or ref_results.get(row.key),
                           REPORT_TABLE1[row.name]["sts_spearman"]) for row in present]
        labelled = [(r["name"], r) for r in rows_json] + [(f"*{r['name']}* (reference)", r) for r in refs_json]
        all_results = {**ref_results, **results}
        extra, cells = self.senteval_columns(all_results, rows + present)
        keys = [row.key for row in rows + present]
        md_rows = [[label, r["what"], fmt(r["ours"]["sts_spearman"]), fmt(r["report"]["sts_spearman"])]
                   + cells.get(key, ["–"] * len(extra)) for (label, r), key in zip(labelled, keys)]
        for r, key in zip(rows_json + refs_json, keys):
            r["ours"]["senteval"] = (all_results.get(key) or {}).get("senteval")
        absent = [r.name for r in references if r not in present]
        note = (f"\n{', '.join(absent)} (reference): not trained in this --out-dir yet (`table1` or `all` "
                f"with the same --out-dir trains it).\n" if absent else "")
        md = (f"# {title}\n\n{text}"
              + md_table([first, "What", "Unsup. STS ρ", "(report)"] + extra, md_rows, "llrr" + "r" * len(extra))
              + note
              + "\n## Settings\n\n" + self.settings_md() + "\n" + self.command_md())
        obj = {"rows": rows_json, "reference": refs_json, "settings": self.settings_json(), "command": self.argv}
        self.write(f"{name}.md", md)
        self.write_json(f"{name}.json", obj)
        return obj

    def write_analysis(self, results: dict) -> dict:
        import torch

        rows_json, md_rows, info = [], [], {}
        for row in self.table1_rows:
            r = results.get(row.key)
            q = r["qqp"] if r else {}
            report = REPORT_ANALYSIS[row.name]
            sts = r["sts"] if r else {}
            rows_json.append({"name": row.name, "ours": {"alignment": q.get("alignment"),
                                                          "uniformity": q.get("uniformity"),
                                                          "sts_dev_alignment": sts.get("alignment"),
                                                          "sts_dev_uniformity": sts.get("uniformity")},
                              "report": report})
            md_rows.append([row.name, fmt(q.get("alignment")), fmt(report["alignment"]),
                            fmt(q.get("uniformity")), fmt(report["uniformity"]),
                            fmt(sts.get("alignment")), fmt(sts.get("uniformity"))])
            info = q or info
        sample = (f"{info.get('pairs')} QQP train pairs ({info.get('positives')} duplicates, "
                  f"{info.get('sentences')} distinct sentences)" if info else "QQP train pairs")
        # Histograms of the STS dev cosines: PNG and TensorBoard.
        gold = [p.label for p in read_sts(task_file(self.data_dir, "sts", "dev"))]
        figures, histograms = [], {}
        for row in self.table1_rows:
            if row.name in HISTOGRAM_ROWS and row.key in results:
                cosines = results[row.key]["sts"]["cosines"]
                name = f"figures/sts-dev-cosines-{row.key}.png"
                write_histogram_png(self.out / name, cosines, gold, f"{row.name}: STS dev pair cosines")
                self.outputs.append(str(self.out / name))
                figures.append((row.name, name))
                histograms[row.name] = torch.tensor(cosines)
        md = ("# Alignment and uniformity (report section 6.3)\n\n"
              f"On {sample}, sampled with seed {self.args.seed}. Alignment: mean ‖f(x)−f(y)‖² over duplicate "
              "pairs (lower is better); uniformity: log mean exp(−2‖f(x)−f(y)‖²) over all pairs of sentences "
              "(lower is better); f normalised. The last two columns: the same on STS dev (pairs with gold ≥ 4).\n\n"
              + md_table(["Encoder", "Alignment", "(report)", "Uniformity", "(report)",
                          "STS-dev align.", "STS-dev unif."], md_rows)
              + self.senteval_md(results)
              + "\n# STS dev cosine histograms\n\n"
              + "".join(f"![{n}]({p})\n\n" for n, p in figures)
              + "\n## Settings\n\n" + self.settings_md() + "\n" + self.command_md())
        obj = {"rows": rows_json, "sample": info, "figures": [p for _, p in figures],
               "settings": self.settings_json(), "command": self.argv}
        self.write("analysis.md", md)
        self.write_json("analysis.json", obj)
        self.write("qualitative.md", self.qualitative_md(results))
        self.write_tensorboard(histograms)
        return obj

    def senteval_md(self, results: dict) -> str:
        """The analysis' per-set table of SentEval's STS test sets (Spearman ×100), when run."""
        from .senteval import STS_TASKS
        rows = [(r.name, results[r.key]["senteval"]) for r in self.table1_rows
                if (results.get(r.key) or {}).get("senteval")]
        if not rows:
            return ""
        table = [[name] + [fmt(v["sts"].get(t), 2) for t in STS_TASKS] + [fmt(v["sts_avg"], 2)] for name, v in rows]
        return ("\n# SentEval STS test sets\n\nSpearman ×100 of the cosine of raw vectors (STS12-16: SentEval's "
                f"\"all\" setting), whole sentences, from `{self.senteval_dir}` (`python -m bertcf.evaluate`).\n\n"
                + md_table(["Encoder", *STS_TASKS, "Avg."], table))

    def qualitative_md(self, results: dict) -> str:
        k, rng = self.args.qualitative_pairs, random.Random(self.args.seed)
        rows = [r for r in self.table1_rows if r.key in results]
        sts_dev = read_sts(task_file(self.data_dir, "sts", "dev"))
        picked = sorted(rng.sample(range(len(sts_dev)), min(k, len(sts_dev))), key=lambda i: -sts_dev[i].label)
        table = [[md_cell(sts_dev[i].sentence1, 60), md_cell(sts_dev[i].sentence2, 60), f"{sts_dev[i].label:.1f}"]
                 + [fmt(results[r.key]["sts"]["cosines"][i], 2) for r in rows] for i in picked]
        md = ("# Qualitative examples\n\n## STS dev: gold score and each encoder's cosine (before fine-tuning)\n\n"
              + md_table(["Sentence 1", "Sentence 2", "Gold"] + [r.name for r in rows], table, "llr" + "r" * len(rows)))
        tuned = [r for r in self.table1_rows if self.finetune_results(r) is not None]
        if not tuned:
            return md + "\nNo fine-tuned encoders (table1 with fine-tuning adds QQP and SST predictions here).\n"
        for task, title, reader, fields in (
                ("quora", "QQP dev: duplicate label and each fine-tuned encoder's prediction", read_quora,
                 lambda p: [md_cell(p.sentence1, 60), md_cell(p.sentence2, 60), f"{p.label:g}"]),
                ("sst", "SST-5 dev: sentiment label and each fine-tuned encoder's prediction", read_sst,
                 lambda p: [md_cell(p.sentence, 100), str(p.label)])):
            path = task_file(self.data_dir, task, "dev")
            if not path.is_file():
                continue
            examples = reader(path)
            picked = rng.sample(examples, min(k, len(examples)))
            file = "para-dev-output.csv" if task == "quora" else "sst-dev-output.csv"
            preds = {r.name: read_predictions(self.finetune_dir(r) / "predictions" / file) for r in tuned}
            header = (["Question 1", "Question 2", "Label"] if task == "quora" else ["Sentence", "Label"])
            table = [fields(p) + [_pred(preds[r.name].get(p.id)) for r in tuned] for p in picked]
            md += (f"\n## {title}\n\n"
                   + md_table(header + [r.name for r in tuned], table, "l" * (len(header) - 1) + "r" * (1 + len(tuned))))
        return md

    def write_tensorboard(self, histograms: dict) -> None:
        texts = {name: (self.out / f"{name}.md").read_text() for name in ("table1", "ablations", "analysis",
                                                                            "qualitative")
                 if (self.out / f"{name}.md").is_file()}

        def write(tmp):
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(str(tmp))
            for name, values in histograms.items():
                writer.add_histogram(f"sts_dev_cosines/{name}", values, 0)
            for name, text in texts.items():
                writer.add_text(name, text, 0)
            writer.close()
        save_dir_atomic(self.out / "tb", write)
        self.outputs.append(str(self.out / "tb"))

    def settings_json(self) -> dict:
        a = self.args
        return {k: getattr(a, k) for k in SUITE_KEYS} | {
            "device": str(self.device), "stage_steps": {s: steps_for(s, a.steps_scale) for s in ("mirror", "joint", "flow")},
            "multitask_steps": steps_for("multitask", self.ft_scale), "finetune": self.finetune}

    # -- the whole command ---------------------------------------------------------------------------------
    def run(self, argv) -> dict:
        self.argv = list(argv)
        tasks = self.plan()
        self.preflight(tasks)
        if self.args.dry_run:
            return self.dry_run(tasks)
        self.out.mkdir(parents=True, exist_ok=True)
        if self.args.saved_settings is not None and self.args.saved_settings != {k: getattr(self.args, k)
                                                                                 for k in SUITE_KEYS}:
            print(f"note: {self.out / SUITE_FILE} is updated with this command's settings", flush=True)
        write_json_atomic(self.out / SUITE_FILE, {"settings": {k: getattr(self.args, k) for k in SUITE_KEYS},
                                                  "updated": now()})
        self.execute(tasks)
        rows = self.table1_rows + self.ablation_rows + self.objective_rows
        results = self.evaluate_rows(rows, analysis="analysis" in self.commands)
        summary = {}
        if "table1" in self.commands:
            summary["table1"] = self.write_table1(results)
        if "ablations" in self.commands:
            summary["ablations"] = self.write_ablations(results)
        if "objectives" in self.commands:
            summary["objectives"] = self.write_objectives(results)
        if "analysis" in self.commands:
            summary["analysis"] = self.write_analysis(results)
        wall = time.perf_counter() - self.started
        print(f"done in {wall:.0f} s: " + ", ".join(self.rel(p) for p in self.outputs) + f" in {self.out}", flush=True)
        return summary | {"outputs": self.outputs, "wall_s": wall}

    def dry_run(self, tasks: list[Task]) -> dict:
        n = len(tasks)
        for i, task in enumerate(tasks, 1):
            state = {"done": "finished, would be reused", "resume": "would continue with --resume",
                     "restart": "would be cleared and started again", "new": "would run"}[task.state]
            print(f"[{i}/{n}] {task.label}: {task.description} [{state}]")
            if task.state != "done":
                print(f"    {self.command_line(task)}")
        rows = ", ".join(r.name for r in self.table1_rows + self.ablation_rows + self.objective_rows)
        print(f"then: evaluate {rows} and write the {', '.join(self.commands)} outputs into {self.out}")
        return {"tasks": [{"label": t.label, "kind": t.kind, "dir": str(t.dir), "state": t.state,
                           "command": self.command_line(t)} for t in tasks]}


def _pred(value) -> str:
    if value is None:
        return "–"
    try:
        return f"{float(value):g}"
    except ValueError:
        return md_cell(value, 20)


def write_histogram_png(path, cosines, gold, title: str) -> None:
    """A histogram of pair cosines over [-1, 1], stacked by gold-score band; written atomically."""
    import numpy as np
    from matplotlib.figure import Figure

    cosines, gold = np.asarray(cosines, dtype=float), np.asarray(gold, dtype=float)
    bands = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5.001)]
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.subplots()
    ax.hist([cosines[(gold >= lo) & (gold < hi)] for lo, hi in bands], bins=np.linspace(-1, 1, 81), stacked=True,
            label=[f"gold {lo:g}–{min(hi, 5):g}" for lo, hi in bands], color=[
                "#d73027", "#fc8d59", "#fee090", "#91bfdb", "#4575b4"])
    ax.axvline(float(cosines.mean()), color="black", linestyle="--", linewidth=1,
               label=f"mean {cosines.mean():.2f}")
    ax.set_xlim(-1, 1)
    ax.set_xlabel("cosine similarity of the pair's sentence vectors")
    ax.set_ylabel("STS dev pairs")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return Suite(args).run(argv)


def cli(argv=None) -> int:
    try:
        return run_main(main, argv)
    except (Interrupted, KeyboardInterrupt) as e:
        what = f"{e}; " if isinstance(e, Interrupted) else ""
        print(f"\ninterrupted: {what}run the same command again to continue where it stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(cli())
