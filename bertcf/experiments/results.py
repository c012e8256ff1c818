"""The numbers the tables show, per row: each encoder evaluated once (unsupervised STS dev, the
SentEval suite when its files are there, alignment and uniformity on QQP train), cached in
``OUT/eval/`` by what they depend on, plus the fine-tuned metrics and the pretraining run's own record."""
from __future__ import annotations

import json
import random
from functools import cached_property
from pathlib import Path

from ..data.senteval import TRANSFER_TASKS
from ..data.tasks import read_qqp, read_sst, read_sts, task_file
from ..data.words import word_similarity_files
from ..evaluation import bootstrap
from ..evaluation.lexical import POOLINGS as LEXICAL_POOLINGS
from ..multitask.evaluation import prediction_file
from ..multitask.legacy import renamed_from_para
from ..utils.files import write_json_atomic
from .plan import Plan
from .planned import abs_if_path, read_json
from .rows import Row

PROBE = "senteval"  # the transfer tasks' probe (bertcf.evaluate's default): SentEval's own

#: Our key -> its name in run_multitask.py's metrics.json (each task's ``Task.metric_key`` and
#: multitask.evaluation.SELECTION_METRIC).
FINETUNE_METRICS = {"sst_accuracy": "sst_acc", "qqp_accuracy": "qqp_acc", "sts_pearson": "sts_pearson",
                    "mean_dev": "mean_dev"}


def finetune_metrics(metrics: dict) -> dict:
    """Our four supervised keys from a multitask metrics.json (None where one is missing)."""
    metrics = renamed_from_para(metrics)
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


#: Resamples and seed of the bootstrap intervals of the tables and claims (bertcf.evaluation.bootstrap).
RESAMPLES = 2000
BOOTSTRAP_SEED = 0
#: The fine-tuned metrics: key in the tables -> (task, the bootstrap's metric).
FINETUNED = {"sst_accuracy": ("sst", "accuracy"), "qqp_accuracy": ("qqp", "accuracy"),
             "sts_pearson": ("sts", "pearson")}
READERS = {"sst": read_sst, "qqp": read_qqp, "sts": read_sts}


class ItemScores:
    """Per-item scores of the rows, by metric: ``items(row results of one seed, metric)`` ->
    (scores, gold, groups, bootstrap metric, scale) or None when that seed's row lacks them."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self._examples = {}

    def examples(self, task: str) -> list:
        """The labelled rows of a CS224N dev file, in the file's order, read once."""
        if task not in self._examples:
            path = task_file(self.data_dir, task, "dev")
            self._examples[task] = [e for e in READERS[task](path) if e.label is not None]
        return self._examples[task]

    def items(self, r: dict, metric: str):
        """The per-item evidence of ``metric`` ("sts_spearman", a FINETUNED key, or "senteval_SET")
        in one seed's results ``r`` of a row."""
        if metric == "sts_spearman":  # the cosines are in the dev file's order (results.Evaluation)
            if not r["sts"]:
                return None
            return r["sts"]["cosines"], [float(e.label) for e in self.examples("sts")], None, "spearman", 1.0
        if metric in FINETUNED:
            if r["finetune"] is None:
                return None
            task, kind = FINETUNED[metric]
            predicted = read_predictions(Path(r["info"]["finetune_dir"]) / "predictions" / prediction_file(task, "dev"))
            examples = self.examples(task)
            if any(e.id not in predicted for e in examples):
                return None
            return [float(predicted[e.id]) for e in examples], [float(e.label) for e in examples], None, kind, 1.0
        if metric.startswith("lexical_"):  # lexical_TASK_POOLING
            task, _, pooling = metric.removeprefix("lexical_").rpartition("_")
            pairs = dig_lexical(r, pooling).get("lexical_pairs", {}).get(task)
            return None if pairs is None else (pairs["scores"], pairs["gold"], None, "spearman", 100.0)
        pairs = (r["senteval"] or {}).get("sts_pairs", {}).get(metric.removeprefix("senteval_"))
        if pairs is None:
            return None
        return pairs["scores"], pairs["gold"], pairs["groups"], "spearman", 100.0

    def interval(self, per_seed: dict, metric: str) -> list[float] | None:
        """[lo, hi]: the 95% interval of a row's ``metric`` averaged over its seeds ({seed: results}),
        by the hierarchical bootstrap over the seeds that have it and their items; None when none has."""
        found = [x for x in (self.items(r, metric) for r in per_seed.values()) if x is not None]
        if not found:
            return None
        _, gold, groups, kind, scale = found[0]
        lo, hi = bootstrap.seeds_interval([x[0] for x in found], gold, kind, groups, RESAMPLES, BOOTSTRAP_SEED)
        return [scale * lo, scale * hi]


def dig_lexical(r: dict, pooling: str) -> dict:
    """One seed's word-similarity results of a row with ``pooling`` ({} where there are none)."""
    return (r.get("lexical") or {}).get(pooling) or {}


def lexical_metrics(r: dict) -> list[str]:
    """The word-similarity metrics of one seed's results: lexical_TASK_POOLING."""
    lexical = r.get("lexical") or {}
    return [f"lexical_{task}_{pooling}" for pooling in LEXICAL_POOLINGS
            for task in (lexical.get(pooling) or {}).get("lexical", {})]


def word_similarity(encoder, lexical_dir) -> dict:
    """Every word-similarity task of ``lexical_dir`` with each pooling, [CLS] and mean (with a flow or
    a linear head, its own pooling only: they were fitted to it), with the pairs' cosines (for the claims):
    {"pooling": the encoder's own, "cls": evaluate_words' dict, "mean": ...}."""
    from ..evaluation.lexical import evaluate_words
    fitted = encoder.flow is not None or encoder.dense is not None
    poolings = [encoder.pooling] if fitted else list(LEXICAL_POOLINGS)
    return {"pooling": encoder.pooling} | {p: evaluate_words(encoder, lexical_dir, p, pair_scores=True)
                                           for p in poolings}


def pair_analysis(encoder, pairs, batch_size: int = 64) -> dict:
    """Alignment over the positive pairs (label 1) and uniformity over every distinct sentence
    of ``pairs`` (report section 6.3, on QQP train pairs)."""
    import torch

    from ..evaluation.metrics import alignment, uniformity

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


class Evaluation:
    """Evaluates the rows of a ``Plan`` (whose runs are inspected) for every seed and returns plain
    data for the report: {row key: {seed: {"sts", "senteval", "qqp", "finetune", "info"}}}. An encoder
    that every seed shares (--model, --config, the MLM base) is evaluated once."""

    def __init__(self, plan: Plan):
        self.plan, self.args = plan, plan.args

    @property
    def senteval_dir(self) -> Path:
        return Path(self.args.senteval_dir or self.plan.data_dir / "SentEval")

    @cached_property
    def senteval_tasks(self) -> list[str]:
        """The SentEval tasks whose files are there: STS (test sets), + transfer with --transfer
        (looked up once, not for every row)."""
        from ..data.senteval import STS_TASKS
        from ..evaluation.senteval import present_tasks
        sts = present_tasks(self.senteval_dir, STS_TASKS)
        return sts + present_tasks(self.senteval_dir, TRANSFER_TASKS) if sts and self.args.transfer else sts

    def present(self, row: Row, seed: int) -> bool:
        """The row's encoder exists: --model, --config, or a usable finished pretraining run."""
        source = self.plan.source_run(row, seed)
        return source is None or self.plan.usable(source)

    def _stamp(self, row: Row, seed: int):
        source = self.plan.source_run(row, seed)
        if source is None:  # --model, or --config's random weights (drawn with --seed)
            return {"model": abs_if_path(self.plan.encoder_of(row, seed)), "seed": self.args.seed}
        # "stage": the key eval/ caches have always had (a new name would re-evaluate every row)
        return {"stage": source.spec.name, "finished": source.marker.get("finished")}

    def _eval_dir(self, row: Row, seed: int) -> Path:
        """OUT/eval for --seed and for the encoders every seed shares, the seed's own eval/ otherwise."""
        source = self.plan.source_run(row, seed)
        shared = source is None or source is self.plan.base_run
        return (self.plan.out if shared else self.plan.seed_dir(seed)) / "eval"

    def _cached(self, path: Path, key: dict, compute):
        key = json.loads(json.dumps(key))
        cached = read_json(path)
        if cached and cached.get("key") == key:
            return cached["value"]
        value = compute()
        write_json_atomic(path, {"key": key, "value": value})
        return value

    def _load_encoder(self, row: Row, seed: int):
        import torch

        from ..models.encoder import SentenceEncoder
        torch.manual_seed(self.args.seed)  # a config-only --config: its random weights, the same every time
        encoder = SentenceEncoder.from_pretrained(self.plan.encoder_of(row, seed))
        encoder.max_length = self.args.eval_max_length or encoder.bert.config.max_position_embeddings
        return encoder.to(self.plan.device).eval()

    def _senteval(self, encoder) -> dict:
        """SentEval's tasks, with each STS set's per-pair cosines (``sts_pairs``, for the claims)."""
        from ..evaluation.senteval import evaluate
        mode = "fasttest" if self.args.transfer else "test"  # STS is the same in both modes
        return evaluate(encoder, self.senteval_dir, self.senteval_tasks, mode, pair_scores=True, probe=PROBE)

    def _analysis_pairs(self):
        pairs = read_qqp(task_file(self.plan.data_dir, "qqp", "train"))
        k = self.args.max_analysis_pairs
        if k and k < len(pairs):
            pairs = random.Random(self.args.seed).sample(pairs, k)
        return pairs

    def rows(self, rows: list[Row], analysis: bool) -> dict:
        """The present rows' results for every seed; ``analysis``: with alignment and uniformity on
        QQP train."""
        from ..evaluation.metrics import evaluate_sts

        a = self.args
        sts_dev = read_sts(task_file(self.plan.data_dir, "sts", "dev"))
        qqp = self._analysis_pairs() if analysis else None
        results = {}
        for row in rows:
            results[row.key] = {}
            for seed in self.plan.seeds:
                out = results[row.key][seed] = {"sts": None, "senteval": None, "qqp": None, "lexical": None,
                                                "finetune": self.finetune(row, seed), "info": self.info(row, seed)}
                if not self.present(row, seed):
                    continue
                stamp = self._stamp(row, seed) | {"eval_max_length": a.eval_max_length or "model",
                                                  "data_dir": abs_if_path(a.data_dir)}
                cache = self._eval_dir(row, seed)
                encoder = None

                def load():
                    nonlocal encoder
                    if encoder is None:
                        print(f"evaluating {self.plan.labelled(row.name, seed)} "
                              f"({self.plan.rel(self.plan.encoder_of(row, seed))})", flush=True)
                        encoder = self._load_encoder(row, seed)
                    return encoder

                def sts():
                    r = evaluate_sts(load(), sts_dev)
                    return r | {"cosines": r["cosines"].tolist()}

                out["sts"] = self._cached(cache / f"{row.key}-sts-dev.json", stamp, sts)
                if self.senteval_tasks:
                    key = self._stamp(row, seed) | {"senteval_dir": abs_if_path(self.senteval_dir),
                                                    "tasks": self.senteval_tasks, "pair_scores": True}
                    if set(self.senteval_tasks) & set(TRANSFER_TASKS):  # scores cached with another probe are stale
                        key["probe"] = PROBE
                    out["senteval"] = self._cached(cache / f"{row.key}-senteval.json", key,
                                                   lambda: self._senteval(load()))
                if getattr(a, "lexical_dir", None):
                    key = self._stamp(row, seed) | {"lexical_dir": abs_if_path(a.lexical_dir), "tasks": list(
                        word_similarity_files(a.lexical_dir)), "poolings": list(LEXICAL_POOLINGS)}
                    out["lexical"] = self._cached(cache / f"{row.key}-lexical.json", key,
                                                  lambda: word_similarity(load(), a.lexical_dir))
                if analysis:
                    key = stamp | {"max_analysis_pairs": a.max_analysis_pairs, "seed": a.seed}
                    out["qqp"] = self._cached(cache / f"{row.key}-qqp-train.json", key,
                                              lambda: pair_analysis(load(), qqp))
                del encoder
        return results

    def finetune(self, row: Row, seed: int) -> dict | None:
        """The row's fine-tuned dev metrics for ``seed``, or None."""
        task = self.plan.finetune_runs.get((seed, row.key))
        if not self.plan.usable(task):
            return None
        metrics = read_json(task.dir / "metrics.json")
        return finetune_metrics(metrics) if isinstance(metrics, dict) else None

    def info(self, row: Row, seed: int) -> dict:
        """The row's encoder, its pretraining run's record (best STS dev Spearman, step, wall time) and its
        fine-tuning's directory, wall time and best step."""
        info = {"encoder": self.plan.encoder_of(row, seed)}
        if row.pretraining is not None:
            t = self.plan.pretraining(row.pretraining, seed)
            s = t.marker.get("summary") or {}
            info = {"encoder": str(t.dir / "best"), "stage_best_sts_spearman": s.get("best"),
                    "stage_best_step": s.get("best_step"), "stage_wall_s": t.marker.get("wall_s")}
        task = self.plan.finetune_runs.get((seed, row.key))
        if self.finetune(row, seed) is not None:
            info |= {"finetune_dir": str(task.dir), "finetune_wall_s": task.marker.get("wall_s"),
                     "finetune_best_step": (task.marker.get("summary") or {}).get("best_step")}
        return info
