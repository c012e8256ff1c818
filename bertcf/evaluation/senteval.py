"""SentEval's tasks run on a sentence encoder, as SimCSE runs them (the command is
``python -m bertcf.evaluate``).

STS12-16 (SentEval's "all" setting), STS-B test and SICK-R test: Spearman ×100 of the cosine of
raw vectors, and their average; ``mode="dev"`` scores STS-B dev and SICK-R trial instead (for
model selection). Transfer tasks (MR, CR, SUBJ, MPQA, SST2, TREC, MRPC): a linear probe on
frozen vectors (MRPC: on SentEval's [|u - v|, u * v] of the pair's vectors, or with
``mrpc_features="full"`` on [u, v, |u - v|, u * v]), accuracy ×100 (and F1 for MRPC), with the
validation accuracy that chose its L2 strength (``devacc``). ``probe="senteval"``: SentEval's
PyTorch probe (:mod:`bertcf.evaluation.probe`), ``test`` and ``fasttest`` with the settings of
SentEval's README (its default and prototyping configs); ``probe="sklearn"``: scikit-learn's
logistic regression, ``test`` picking C by an inner validation as SentEval's scikit-learn branch
does, ``fasttest`` with 5 folds and a fixed C. The transfer average covers the tasks that ran
(``transfer_avg_tasks``). A task whose files are absent is skipped with a warning. ``lexical``
among the tasks adds word similarity (``evaluation.lexical``: every word-similarity file of
``lexical_dir``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..data import senteval as se
from ..errors import DataError, UsageError
from ..utils.progress import track
from .bootstrap import percentile_interval
from .evaluators import (
    INNER_KFOLD_GRID,
    KFOLD_GRID,
    PAIR_FEATURES,
    CVClassificationEvaluator,
    ProbeSettings,
    SplitClassificationEvaluator,
    STSEvaluator,
    TrainTestClassificationEvaluator,
)
from .lexical import evaluate_words
from .probe import FASTTEST, TEST, torch_threads

logger = logging.getLogger("bertcf.senteval")

MODES = ("test", "dev", "fasttest")
PROBES = ("senteval", "sklearn")
TASK_GROUPS = {"sts": se.STS_TASKS, "transfer": se.TRANSFER_TASKS}
LEXICAL = "lexical"  # word similarity: the files of --lexical-dir, not SentEval's


def split_keyword(text: str | list | tuple, keyword: str) -> tuple[list[str], bool]:
    """(--tasks without ``keyword``, whether ``keyword`` was among them)."""
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    rest = [t for t in items if t and t.lower() != keyword]
    return rest, any(t.lower() == keyword for t in items)


def split_lexical(text: str | list | tuple) -> tuple[list[str], bool]:
    """(--tasks without ``lexical``, whether ``lexical`` was among them)."""
    return split_keyword(text, LEXICAL)


def parse_tasks(text: str | list | tuple) -> list[str]:
    """'sts,transfer' or task names ('STS12,CR') -> SentEval task names, in the standard order."""
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    known = {name.lower(): name for name in se.STS_TASKS + se.TRANSFER_TASKS}
    chosen = set()
    for item in filter(None, items):
        if item.lower() in TASK_GROUPS:
            chosen.update(TASK_GROUPS[item.lower()])
        elif item.lower() in known:
            chosen.add(known[item.lower()])
        else:
            raise UsageError(f"--tasks: unknown task {item!r} (sts, transfer, lexical, or one of "
                             f"{', '.join(se.STS_TASKS + se.TRANSFER_TASKS)})")
    if not chosen:
        raise UsageError("--tasks: no task given")
    return [t for t in se.STS_TASKS + se.TRANSFER_TASKS if t in chosen]


def _files(task: str, mode: str) -> list[str]:
    split = "dev" if mode == "dev" else "test"
    if task in se.STS_YEARS:
        return [str(p) for p in se.sts_year_files("", task)]
    if task == "STSBenchmark":
        return [se.STSB_FILES[split]]
    if task == "SICKRelatedness":
        return [se.SICK_FILES[split]]
    return {"SST2": list(se.SST2_FILES.values()), "TREC": list(se.TREC_FILES.values()),
            "MRPC": list(se.MRPC_FILES.values())}.get(task) or list(se.BINARY_FILES[task])


def probe_settings(task: str, mode: str, probe: str = "senteval", threads: int | None = None):
    """The probe of a transfer task: SentEval's PyTorch probe with its README's settings for the mode,
    or the scikit-learn probe; ``threads``: the processes that train probes at the same time."""
    if probe == "senteval":
        return replace(FASTTEST if mode == "fasttest" else TEST, jobs=threads)
    if mode == "fasttest":
        return ProbeSettings(folds=5, n_jobs=threads)
    return ProbeSettings(folds=10, c_grid=KFOLD_GRID if task in ("TREC", "MRPC") else INNER_KFOLD_GRID,
                         n_jobs=threads)


def build_evaluator(senteval_dir, task: str, mode: str = "test", mrpc_features: str = "senteval",
                    probe: str = "senteval", threads: int | None = None):
    """The evaluator of one SentEval task, its files read (DataError on a malformed line);
    ``mrpc_features``: MRPC's pair features (:data:`bertcf.evaluation.evaluators.PAIR_FEATURES`);
    ``probe``: "senteval" or "sklearn" (:func:`probe_settings`)."""
    d = Path(senteval_dir)
    split = "dev" if mode == "dev" else "test"
    if task in se.STS_YEARS:
        return STSEvaluator(task, se.read_sts_year(d, task))
    if task == "STSBenchmark":
        return STSEvaluator(task, {split: se.read_stsb(d / se.STSB_FILES[split])})
    if task == "SICKRelatedness":
        return STSEvaluator(task, {split: se.read_sick(d / se.SICK_FILES[split])})
    settings = probe_settings(task, mode, probe, threads)
    if task in se.BINARY_FILES:
        return CVClassificationEvaluator(task, *se.read_binary(*(d / f for f in se.BINARY_FILES[task])), settings)
    if task == "SST2":
        return SplitClassificationEvaluator(task, {k: se.read_sst2(d / f) for k, f in se.SST2_FILES.items()}, settings)
    reader = se.read_trec if task == "TREC" else se.read_mrpc
    files = se.TREC_FILES if task == "TREC" else se.MRPC_FILES
    return TrainTestClassificationEvaluator(task, reader(d / files["train"]), reader(d / files["test"]), settings,
                                            pairs=mrpc_features if task == "MRPC" else None)


def present_tasks(senteval_dir, tasks, mode: str = "test") -> list[str]:
    """The tasks of ``tasks`` whose files are all in ``senteval_dir`` (no warning)."""
    return [t for t in tasks if not se.missing_files(senteval_dir, _files(t, mode))]


def available_tasks(senteval_dir, tasks, mode: str = "test") -> list[str]:
    """The tasks of ``tasks`` whose files are all in ``senteval_dir``; each other one is skipped
    with a warning naming its first missing file."""
    found = []
    for task in tasks:
        missing = se.missing_files(senteval_dir, _files(task, mode))
        if missing:
            logger.warning("warning: %s skipped: %s not found", task, missing[0])
        else:
            found.append(task)
    return found


def evaluate(encoder, senteval_dir, tasks="sts", mode: str = "test", batch_size: int = 64,
             max_length: int | None = None, show_progress_bar: bool = False, pair_scores: bool = False,
             mrpc_features: str = "senteval", probe: str = "senteval", threads: int | None = None,
             lexical_dir=None, lexical_pooling: str | None = None) -> dict:
    """Run SentEval's ``tasks`` ('sts', 'transfer', task names) on a SentenceEncoder.

    Every distinct sentence of every task is encoded once, in length-sorted batches, up to
    ``max_length`` tokens (default: the model's max_position_embeddings, i.e. whole sentences);
    the probes read the cached vectors. Returns {"mode", "probe", "sts": {task: Spearman ×100},
    "sts_avg", "sts_avg_ci95", "sts_detail": {task: all, mean, wmean, subsets, ci95}, "transfer":
    {task: {accuracy, devacc[, f1, features], n}}, "transfer_avg", "transfer_avg_tasks", "seconds":
    {"encode", task: wall seconds}}; averages are over the tasks that ran (None when none did), and
    ``transfer_avg_tasks`` lists the tasks ``transfer_avg`` covers (SentEval's average is of all
    seven). ``ci95`` is a task's bootstrap interval (:class:`STSEvaluator`); ``sts_avg_ci95``
    averages the tasks' replicates, resample r of each task with resample r of the others, before
    taking the percentiles. ``pair_scores``: also "sts_pairs": {task: {"scores": cosines, "gold",
    "groups": subsets}} (lists over the pairs, in the order of "all"), for bootstraps over several
    encoders. ``mrpc_features``: "senteval" ([|u - v|, u * v], SentEval's mrpc.py) or "full".
    ``probe``: "senteval" (SentEval's PyTorch probe) or "sklearn" (:func:`probe_settings`);
    ``threads``: torch's threads while the probes run, and the processes that train them (None:
    torch's threads as they are, one process). Raises DataError when no task has its files.
    ``lexical`` in ``tasks``: also word similarity on every file of ``lexical_dir``
    (``evaluation.lexical.evaluate_words``: "lexical", "lexical_detail" and with ``pair_scores``
    "lexical_pairs"), the words pooled by ``lexical_pooling`` (default: the encoder's pooling)."""
    if mode not in MODES:
        raise UsageError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mrpc_features not in PAIR_FEATURES:
        raise UsageError(f"--mrpc-features must be one of {', '.join(PAIR_FEATURES)}, not {mrpc_features!r}")
    if probe not in PROBES:
        raise UsageError(f"--probe must be one of {', '.join(PROBES)}, not {probe!r}")
    senteval_tasks, lexical = split_lexical(tasks)
    if lexical:  # first: its files are small, and a bad one stops the command before SentEval's work
        if mode == "dev":
            raise UsageError("--mode dev: the word-similarity sets have no dev split; score lexical in --mode test")
        words = evaluate_words(encoder, lexical_dir, lexical_pooling, batch_size, pair_scores, show_progress_bar)
        return words | (evaluate(encoder, senteval_dir, senteval_tasks, mode, batch_size, max_length,
                                 show_progress_bar, pair_scores, mrpc_features, probe, threads) if senteval_tasks
                        else _empty_result(mode, pair_scores, probe))
    tasks = parse_tasks(tasks)
    if mode == "dev" and any(t in se.TRANSFER_TASKS for t in tasks):
        raise UsageError("--mode dev scores STS-B dev and SICK-R trial only; run the transfer tasks "
                         "with --mode test or fasttest")
    if mode == "dev":
        tasks = [t for t in tasks if t not in se.STS_YEARS]  # STS12-16 have no dev split
    senteval_dir = se.check_dir(senteval_dir)
    found = available_tasks(senteval_dir, tasks, mode)
    if not found:
        raise DataError(f"{senteval_dir}: none of the tasks {', '.join(tasks)} has its files "
                        f"(layout: data/README.md, 'SentEval')")
    evaluators = [build_evaluator(senteval_dir, task, mode, mrpc_features, probe, threads) for task in found]

    started = time.perf_counter()
    sentences = list(dict.fromkeys(s for e in evaluators for s in e.sentences()))
    vectors = encoder.encode(sentences, batch_size=batch_size, show_progress_bar=show_progress_bar,
                             max_length=max_length or encoder.bert.config.max_position_embeddings)
    row = {s: i for i, s in enumerate(sentences)}

    def embed(batch):
        return vectors[[row[s] for s in batch]]

    result = _empty_result(mode, pair_scores, probe)
    result["seconds"]["encode"] = time.perf_counter() - started
    with torch_threads(threads):
        _score(evaluators, embed, result, pair_scores, show_progress_bar)
    return result


def _score(evaluators, embed, result: dict, pair_scores: bool, show_progress_bar: bool) -> None:
    """Run the evaluators on the cached vectors (``embed``) and fill ``result`` in."""
    replicates = []
    for evaluator in track(evaluators, "tasks", show_progress_bar, unit="task"):
        started = time.perf_counter()
        scores = evaluator(embed)
        result["seconds"][evaluator.name] = time.perf_counter() - started
        if isinstance(evaluator, STSEvaluator):
            replicates.append(scores.pop("replicates"))
            pairs = scores.pop("pairs")
            if pair_scores:
                result["sts_pairs"][evaluator.name] = pairs
            result["sts"][evaluator.name] = scores[evaluator.main_metric]
            result["sts_detail"][evaluator.name] = scores
        else:
            result["transfer"][evaluator.name] = scores
    if result["sts"]:
        result["sts_avg"] = sum(result["sts"].values()) / len(result["sts"])
        result["sts_avg_ci95"] = percentile_interval(np.mean(replicates, axis=0))
    result["transfer_avg_tasks"] = list(result["transfer"])  # SentEval's order
    if result["transfer"]:
        result["transfer_avg"] = sum(r["accuracy"] for r in result["transfer"].values()) / len(result["transfer"])


def _empty_result(mode: str, pair_scores: bool, probe: str) -> dict:
    return {"mode": mode, "probe": probe, "sts": {}, "sts_avg": None, "sts_avg_ci95": None, "sts_detail": {},
            "transfer": {}, "transfer_avg": None, "transfer_avg_tasks": [], "seconds": {}} | (
                {"sts_pairs": {}} if pair_scores else {})


def format_table(result: dict) -> str:
    """SimCSE's tables: STS12 ... SICKRelatedness Avg. (and the transfer tasks); '-' where skipped.
    Under the STS scores, their 95% bootstrap intervals. An average that does not cover every task
    of its table is headed "Avg. of N" and followed by a line naming the tasks it covers."""
    def table(names, values, avg, avg_name="Avg.", intervals=None):  # avg_name None: no average column
        def cell(v):
            return "-" if v is None else f"[{v[0]:.2f}, {v[1]:.2f}]" if isinstance(v, list) else f"{v:.2f}"
        if avg_name is not None:
            names, values = names + [avg_name], values + [avg]
        rows = [names, [cell(v) for v in values]]
        if intervals is not None:
            rows.append([cell(v) for v in intervals])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        line = lambda items: "| " + " | ".join(i.rjust(w) for i, w in zip(items, widths)) + " |"
        return "\n".join([rule, line(rows[0]), rule, *map(line, rows[1:]), rule])

    def covered(names, ran):
        """The average's heading, and a line naming what it covers when that is not every task."""
        if len(ran) == len(names):
            return "Avg.", []
        name = f"Avg. of {len(ran)}"
        return name, [f"{name}: {', '.join(ran)} (not run: {', '.join(t for t in names if t not in ran)})"]

    parts = []
    if result["sts"]:
        names = [t for t in se.STS_TASKS if result["mode"] != "dev" or t not in se.STS_YEARS]
        intervals = [result["sts_detail"].get(t, {}).get("ci95") for t in names] + [result.get("sts_avg_ci95")]
        avg_name, note = covered(names, list(result["sts"]))
        parts += [table(names, [result["sts"].get(t) for t in names], result["sts_avg"], avg_name, intervals)] + note
    if result["transfer"]:
        names = list(se.TRANSFER_TASKS)
        avg_name, note = covered(names, result["transfer_avg_tasks"])
        parts += [table(names, [result["transfer"].get(t, {}).get("accuracy") for t in names],
                        result["transfer_avg"], avg_name)] + note
        devacc = [f"{t} {r['devacc']:.2f}" for t, r in result["transfer"].items() if r.get("devacc") is not None]
        probe = {"senteval": "SentEval's PyTorch probe", "sklearn": "scikit-learn's logistic regression"}
        parts.append(f"probe: {probe.get(result.get('probe'), result.get('probe'))}"
                     + (f"; dev accuracy (it chose the L2 strength): {', '.join(devacc)}" if devacc else ""))
        if "MRPC" in result["transfer"]:
            mrpc = result["transfer"]["MRPC"]
            parts.append(f"MRPC F1: {mrpc['f1']:.2f} (features {mrpc['features']}: {PAIR_FEATURES[mrpc['features']]})")
    if result.get("lexical"):
        names, detail = list(result["lexical"]), result["lexical_detail"]
        poolings = ", ".join(sorted({"[CLS]" if d["pooling"] == "cls" else d["pooling"] for d in detail.values()}))
        parts += [f"Word similarity: Spearman ×100 of the cosine, {poolings} pooling",
                  table(names, [result["lexical"][t] for t in names], None, None, [detail[t]["ci95"] for t in names])]
    return "\n".join(parts)
