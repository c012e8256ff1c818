"""Each task's dev metric against the step, for choosing a stage-3 budget
(``python -m bertcf.multitask.curves RUNS_DIR --out curves.png``).

``RUNS_DIR`` holds run directories named ``LABEL-seedN``, as ``bertcf.multitask.compare`` reads
them; each run's ``metrics.jsonl`` gives its evaluations during training (the rows that
``--max-eval-examples`` draws). One panel per task, one colour per label, one line per seed. The
same curves are in TensorBoard under ``eval/TASK_METRIC`` (``tensorboard --logdir RUNS_DIR``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import DataError, UsageError
from .compare import labels_of, runs_by_label, runs_parser, seeds_of, selected, where

NOT_METRICS = ("step", "mean_dev")


def read_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metric key -> [(step, value)] of a run's evaluations during training (``metrics.jsonl``);
    the task-batch counters beside them (``batches_*``) are left out."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{path} not found: {run_dir} has no evaluations to draw")
    curves: dict[str, list[tuple[int, float]]] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
            step = int(record["step"])
            values = {k: float(v) for k, v in record.items() if k not in NOT_METRICS and not k.startswith("batches_")}
        except (ValueError, KeyError, TypeError):
            raise DataError(f"{path}, line {number}: not an evaluation record (a JSON object with a step and "
                            f"numbers)") from None
        for key, value in values.items():
            curves.setdefault(key, []).append((step, value))
    return curves


def plot(runs_dir, out, labels=None, seeds=None) -> Path:
    """Draw the curves of the runs in ``runs_dir`` (those of ``labels`` and ``seeds`` only, when
    given) into the PNG ``out``; returns its path."""
    from matplotlib.figure import Figure  # not pyplot: no display, and the caller's backend left alone

    groups = runs_by_label(runs_dir, seeds=seeds)
    if labels:
        groups = selected(groups, labels, runs_dir, seeds)
    if not groups:
        raise UsageError(f"no finished runs named LABEL-seedN {where(runs_dir, seeds)}")
    curves = {(label, seed): read_curves(path) for label, by_seed in groups.items() for seed, path in by_seed.items()}
    metrics = sorted({key for by_key in curves.values() for key in by_key})
    figure = Figure(figsize=(4.5 * len(metrics), 3.6))
    axes = figure.subplots(1, len(metrics), squeeze=False)
    colours = {label: f"C{i % 10}" for i, label in enumerate(groups)}
    for ax, key in zip(axes[0], metrics):
        for (label, seed), by_key in curves.items():
            if key in by_key:
                steps, values = zip(*by_key[key])
                first = seed == min(groups[label])
                ax.plot(steps, values, color=colours[label], marker=".", alpha=0.8, label=label if first else None)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    figure.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.png")  # written whole, then moved: never half a picture
    figure.savefig(tmp, dpi=110)
    tmp.replace(out)
    return out


def main(argv=None) -> int:
    from ..cli import run_main

    def run(args):
        parser = runs_parser("python -m bertcf.multitask.curves", __doc__.split("\n")[0])
        parser.add_argument("--out", required=True, help="the PNG to write")
        options = parser.parse_args(args)
        print(plot(options.runs_dir, options.out, labels_of(options), seeds_of(options)))
    return run_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
