"""Stage-3 runs compared over seeds, with verdicts as the experiments give them
(``python -m bertcf.multitask.compare RUNS_DIR --baseline LABEL``).

``RUNS_DIR`` holds run directories named ``LABEL-seedN`` (e.g. ``pcgrad-seed1``, ``sum-seed1``).
For each label and each task of the baseline's runs, the claim "LABEL > baseline" is tested on
the task's dev metric: the difference is averaged over the seeds both labels ran with, and its
95% interval comes from the project's paired, hierarchical bootstrap
(``bertcf.evaluation.bootstrap.paired_difference``: the seeds resampled, then the dev examples,
the same examples for both). **supported**: the interval lies above 0; **contradicted**: below 0;
**inconclusive**: it holds 0. The predictions are the runs' ``predictions/*-dev-output.csv``
(the best checkpoint's), the gold labels the dev files the runs' config.json names.

A label whose runs trained some of the baseline's tasks (a single-task run, ``--tasks sst``, or
an independent fine-tune of one task) is compared on those tasks alone: single-task runs are
baselines of a joint run's tasks, or the joint run theirs.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from ..data.tasks import READERS
from ..errors import DataError, UsageError
from ..evaluation.bootstrap import paired_difference
from ..utils.files import write_json_atomic, write_text_atomic
from .data import check_unique_ids, read_rows
from .evaluation import prediction_file, read_predictions, task_metric
from .legacy import renamed_from_para, run_builtin_tasks
from .tasks import Task

RUN_NAME = re.compile(r"(?P<label>.+)-seed(?P<seed>\d+)\Z")
RESAMPLES, BOOTSTRAP_SEED = 2000, 0


def runs_by_label(runs_dir, finished: bool = True, seeds=None) -> dict[str, dict[int, Path]]:
    """label -> {seed: run directory} of the finished runs (with a metrics.json) in ``runs_dir``
    (``finished=False``: of the others), of the seeds in ``seeds`` alone when it is given."""
    found: dict[str, dict[int, Path]] = {}
    for path in sorted(Path(runs_dir).iterdir()):
        match = RUN_NAME.match(path.name)
        if (match and path.is_dir() and (path / "metrics.json").is_file() == finished
                and (seeds is None or int(match["seed"]) in seeds)):
            found.setdefault(match["label"], {})[int(match["seed"])] = path
    return found


def run_tasks(run_dir: Path) -> list[Task]:
    """The tasks a run trained, from its config.json (a run from before tasks were declared: the
    report's three)."""
    try:
        config = renamed_from_para(json.loads((run_dir / "config.json").read_text()))
    except (OSError, ValueError):
        raise DataError(f"{run_dir / 'config.json'} is missing or not valid JSON: the run's settings name its "
                        f"tasks and dev files") from None
    if "declared_tasks" in config:
        return [Task(**d) for d in config["declared_tasks"]]
    return run_builtin_tasks(config)


def gold_labels(task: Task) -> dict:
    """id -> gold label of the task's labeled dev rows."""
    if task.reader:
        return {r.id: r.label for r in READERS[task.reader](task.dev, labeled=True)}
    ids, _, labels = read_rows(task, task.dev, labeled=True)
    check_unique_ids(task, Path(task.dev), ids)  # keyed by id: two rows of one id would be one
    return {i: label for i, label in zip(ids, labels) if label is not None}


def dev_predictions(run_dir: Path, task: Task) -> dict:
    """id -> the run's dev prediction for ``task``."""
    path = run_dir / "predictions" / prediction_file(task.name, "dev")
    if not path.is_file():
        raise DataError(f"{path} not found: {run_dir} has no {task.name} dev predictions")
    try:
        return read_predictions(path, task)
    except DataError as e:
        raise DataError(f"{e}; write it again with run_multitask.py --predict-only --checkpoint {run_dir}") from None


def predictions_of(run_dir: Path, task: Task, ids: list) -> list:
    """The run's dev predictions for ``ids`` (the gold rows), in their order; DataError when one is missing."""
    found = dev_predictions(run_dir, task)
    missing = [i for i in ids if i not in found]
    if missing:
        raise DataError(f"{run_dir / 'predictions' / prediction_file(task.name, 'dev')} has no prediction for id "
                        f"{missing[0]!r} ({len(missing)} of the {len(ids)} dev rows missing): the file is cut short, "
                        f"or the run read another dev file")
    return [found[i] for i in ids]


def trained_tasks(label: str, seeds: dict[int, Path]) -> set[str]:
    """The tasks the runs of ``label`` trained: the same in every seed's run, or UsageError (a
    seed's run of other tasks would be compared as if it were another seed of the same run)."""
    found = {seed: {t.name for t in run_tasks(d)} for seed, d in seeds.items()}
    first, *others = found.items()
    for seed, names in others:
        if names != first[1]:
            raise UsageError(f"{label}: {seeds[seed].name} trained {', '.join(sorted(names))}, "
                             f"{seeds[first[0]].name} {', '.join(sorted(first[1]))}: one label's seeds must be runs "
                             f"of the same tasks (rename one)")
    return first[1]


def where(runs_dir, seeds=None) -> str:
    """Where runs were looked for, for an error: the directory, and the --seeds that narrowed it (a
    label may have finished runs of other seeds)."""
    return f"in {runs_dir}" + (f" of --seeds {','.join(map(str, sorted(seeds)))}" if seeds else "")


def selected(groups: dict, labels: list[str], runs_dir, seeds=None) -> dict:
    """``groups`` (label -> runs) of ``labels`` alone, in their order; UsageError for a label
    without finished runs."""
    missing = [label for label in labels if label not in groups]
    if missing:
        raise UsageError(f"--labels: no finished runs named {missing[0]}-seedN {where(runs_dir, seeds)}")
    return {label: groups[label] for label in labels}


def runs_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments of a command on the runs of a directory (compare, curves): RUNS_DIR [--labels]
    [--seeds]."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("runs_dir", help="a directory of run directories named LABEL-seedN")
    parser.add_argument("--labels", help="only these labels, comma-separated (default: all)")
    parser.add_argument("--seeds", help="only the runs of these seeds, comma-separated (default: every seed; "
                                        "e.g. while a series has run some seeds of a label and not others)")
    return parser


def labels_of(options) -> list[str] | None:
    """--labels as a list (None: all); UsageError when RUNS_DIR is no directory."""
    if not Path(options.runs_dir).is_dir():
        raise UsageError(f"{options.runs_dir} is not a directory")
    return [x.strip() for x in options.labels.split(",") if x.strip()] if options.labels else None


def seeds_of(options) -> set[int] | None:
    """--seeds as a set (None: every seed); UsageError when one is not a whole number."""
    if not options.seeds:
        return None
    try:
        return {int(x) for x in options.seeds.split(",") if x.strip()}
    except ValueError:
        raise UsageError(f"--seeds {options.seeds}: not comma-separated whole numbers (e.g. --seeds 1,2)") from None


def compare(runs_dir, baseline: str, labels=None, seeds=None) -> dict:
    """Every other label (or those of ``labels``) against ``baseline``, task by task (the module's
    docstring), over the runs of ``seeds`` alone when it is given."""
    groups = runs_by_label(runs_dir, seeds=seeds)
    if baseline not in groups:
        raise UsageError(f"--baseline {baseline}: no finished runs named {baseline}-seedN {where(runs_dir, seeds)} "
                         f"(found: {', '.join(groups) or 'none'})")
    if labels:
        groups = selected(groups, [baseline, *[x for x in labels if x != baseline]], runs_dir, seeds)
    # a seed left out is one fewer in the comparison: said, and recorded with the result
    left_out = [d.name for label, by_seed in runs_by_label(runs_dir, False, seeds).items()
                if not labels or label in groups for d in by_seed.values()]
    if left_out:
        print(f"note: left out, no metrics.json (unfinished or stopped): {', '.join(left_out)}", file=sys.stderr)
    tasks = run_tasks(next(iter(groups[baseline].values())))
    gold = {t.name: gold_labels(t) for t in tasks}
    names = {label: trained_tasks(label, by_seed) for label, by_seed in groups.items()}
    for label, trained in names.items():
        if not trained & set(gold):
            raise UsageError(f"{label}: its runs trained {', '.join(sorted(trained))}, none of the tasks of "
                             f"--baseline {baseline} ({', '.join(gold)})")
    rows, scores = [], {}
    for label, by_seed in groups.items():
        scores[label] = {}
        for task in (t for t in tasks if t.name in names[label]):
            ids = sorted(gold[task.name])
            per_seed = {s: predictions_of(d, task, ids) for s, d in by_seed.items()}
            values = [task_metric(task, p, [gold[task.name][i] for i in ids]) for p in per_seed.values()]
            scores[label][task.name] = {"mean": statistics.mean(values), "sd": statistics.stdev(values)
                                        if len(values) > 1 else 0.0, "seeds": sorted(by_seed), "per_seed": per_seed}
    for label in groups:
        if label == baseline:
            continue
        common = sorted(set(groups[label]) & set(groups[baseline]))
        for task in (t for t in tasks if t.name in scores[label]):
            ids = sorted(gold[task.name])
            a = [scores[label][task.name]["per_seed"][s] for s in common]
            b = [scores[baseline][task.name]["per_seed"][s] for s in common]
            result = paired_difference(a, b, [gold[task.name][i] for i in ids], task.metric,
                                       resamples=RESAMPLES, seed=BOOTSTRAP_SEED)
            rows.append({"a": label, "b": baseline, "task": task.name, "metric": task.metric_key,
                         "a_mean": scores[label][task.name]["mean"], "b_mean": scores[baseline][task.name]["mean"],
                         **result})
    summary = {label: {t: {k: v for k, v in s.items() if k != "per_seed"} for t, s in by_task.items()}
               for label, by_task in scores.items()}
    for label, by_task in summary.items():
        if all(t.name in by_task for t in tasks):  # a mean of every task, or none
            by_task["mean"] = {"mean": statistics.mean(by_task[t.name]["mean"] for t in tasks)}
    return {"baseline": baseline, "tasks": [t.name for t in tasks], "scores": summary, "claims": rows,
            "left_out": left_out}


def markdown(result: dict) -> str:
    """The scores (mean ± sd over seeds) and the claims, as two tables."""
    tasks = result["tasks"]
    lines = ["| run | " + " | ".join(tasks) + " | mean | seeds |", "| --- |" + " ---: |" * (len(tasks) + 2)]
    for label, by_task in result["scores"].items():
        cells = [f"{by_task[t]['mean']:.4f} ± {by_task[t]['sd']:.4f}" if t in by_task else "—" for t in tasks]
        mean = f"{by_task['mean']['mean']:.4f}" if "mean" in by_task else "—"
        seeds = max(len(s["seeds"]) for t, s in by_task.items() if t != "mean")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {mean} | {seeds} |")
    lines += ["", "| a | b | metric | a − b | 95% CI | seeds | verdict |", "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for c in result["claims"]:
        lo, hi = c["ci95"]
        lines.append(f"| {c['a']} | {c['b']} | {c['metric']} | {c['mean_difference']:+.4f} | [{lo:+.4f}, {hi:+.4f}] | "
                     f"{c['seeds']} | **{c['verdict']}** |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from ..cli import run_main

    def run(args):
        parser = runs_parser("python -m bertcf.multitask.compare", __doc__.split("\n")[0])
        parser.add_argument("--baseline", required=True, help="the label the others are compared with")
        parser.add_argument("--out", help="also write OUT.json and OUT.md")
        options = parser.parse_args(args)
        result = compare(options.runs_dir, options.baseline, labels_of(options), seeds_of(options))
        text = markdown(result)
        if options.out:
            write_json_atomic(Path(options.out + ".json"), result)
            write_text_atomic(Path(options.out + ".md"), text)
        print(text, end="")
        return result
    return run_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
