"""Scoring sentence pairs, by a cross-encoder or by a bi-encoder, on the pair sets the cross-encoder
is measured on: the CS224N STS dev file (Spearman and Pearson), the CS224N QQP dev file (accuracy)
and SentEval's STS-B test (Spearman and Pearson), each with its bootstrap interval.

A pair's score (``pair_scores``): a cross-encoder's probability that the pair is similar (the
sigmoid of its relevance, ``CrossEncoder.relevance``: of its one logit, or for two labels the softmax
of label 1), or a bi-encoder's cosine. QQP's
prediction is "duplicate" when the score is at least 0.5: the cross-encoder's even odds, and the
midpoint of the 0/1 cosine targets of a bi-encoder trained on QQP (``--method sbert-cosine``).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.senteval import STSB_FILES, read_stsb
from ..data.tasks import PairExample, read_qqp, read_sts, task_file
from ..errors import DataError
from ..evaluation.bootstrap import interval
from ..evaluation.metrics import accuracy, encode_pairs, pearson, spearman
from ..models.cross_encoder import CrossEncoder, is_cross_encoder
from ..models.encoder import SentenceEncoder
from ..utils import environment
from ..utils.files import write_json_atomic
from ..utils.precision import resolve_device, resolve_precision

PAIR_SETS = ("sts-dev", "qqp-dev", "stsb-test")
MAIN_METRIC = {"sts-dev": "sts_dev_spearman", "qqp-dev": "qqp_dev_acc", "stsb-test": "stsb_test_spearman"}
DUPLICATE_AT = 0.5


def pair_set_paths(data_dir, sts_dev=None, qqp_dev=None, senteval_dir=None) -> dict:
    """{set name: its file}: the flags' files, else the standard names (CS224N's in ``data_dir``,
    STS-B test under ``senteval_dir``, default DATA_DIR/SentEval)."""
    senteval = Path(senteval_dir) if senteval_dir else Path(data_dir) / "SentEval"
    return {"sts-dev": Path(sts_dev or task_file(data_dir, "sts", "dev")),
            "qqp-dev": Path(qqp_dev or task_file(data_dir, "qqp", "dev")),
            "stsb-test": senteval / STSB_FILES["test"]}


def read_pair_set(name: str, path) -> list:
    """The labelled pairs (``PairExample``) of one set; a missing or malformed file is a DataError."""
    if name == "stsb-test":
        return read_stsb(path)
    return (read_sts if name.startswith("sts") else read_qqp)(path, labeled=True)


def pair_scores(model, pairs, batch_size: int = 64, show_progress_bar=False, name: str = "score") -> torch.Tensor:
    """The score [n] float32 of each pair (``PairExample`` or two-text tuples), see the module's
    docstring; ``model``: a :class:`CrossEncoder` (the sigmoid of ``CrossEncoder.relevance``: the
    probability of label 1, for two labels their softmax's) or a ``SentenceEncoder`` (the cosine).
    ``show_progress_bar``: True or a mode of ``utils.progress`` (the pairs scored, the time left)."""
    texts = [(p.sentence1, p.sentence2) if hasattr(p, "sentence1") else tuple(p) for p in pairs]
    if not isinstance(model, CrossEncoder):
        x, y = encode_pairs(model, [PairExample("", *t, None) for t in texts], batch_size)
        return F.cosine_similarity(x, y, dim=-1)
    return torch.sigmoid(model.relevance(texts, batch_size, show_progress_bar, name))


def set_metrics(name: str, scores: torch.Tensor, pairs, resamples: int = 1000) -> dict:
    """The metrics of one set, keyed ``{set}_{metric}`` with ``_ci95`` intervals: STS sets'
    Spearman and Pearson of the scores, QQP's accuracy of score >= 0.5."""
    prefix, gold = name.replace("-", "_"), [p.label for p in pairs]
    if name == "qqp-dev":
        predicted = (scores >= DUPLICATE_AT).long()
        return {f"{prefix}_acc": accuracy(predicted, torch.tensor(gold).long()),
                f"{prefix}_acc_ci95": interval(predicted.tolist(), gold, "accuracy", resamples)}
    return {f"{prefix}_spearman": spearman(scores, gold), f"{prefix}_pearson": pearson(scores, gold),
            f"{prefix}_spearman_ci95": interval(scores.tolist(), gold, "spearman", resamples)}


class PairSetEvaluator:
    """One pair set scored during training (``name`` of :data:`PAIR_SETS`, ``pairs`` its first
    rows): ``evaluator(model) -> metrics``; its ``main_metric`` picks best/."""

    def __init__(self, name: str, pairs, batch_size: int = 64, show_progress_bar=False):
        self.name, self.pairs, self.batch_size = name, pairs, batch_size
        self.show_progress_bar = show_progress_bar
        self.main_metric = MAIN_METRIC[name]

    def __call__(self, model) -> dict:
        scores = pair_scores(model, self.pairs, self.batch_size, self.show_progress_bar, f"eval {self.name}")
        metrics = set_metrics(self.name, scores, self.pairs)
        return {k: v for k, v in metrics.items() if not k.endswith("_ci95")}


def evaluate_pair_sets(model, sets: dict, batch_size: int = 64, show_progress_bar=False) -> dict:
    """The metrics of every set of ``sets`` ({name: pairs}), one dict; ``show_progress_bar``: each
    set's pairs scored and the time left (True or a mode of ``utils.progress``)."""
    result = {}
    for name, pairs in sets.items():
        scores = pair_scores(model, pairs, batch_size, show_progress_bar, f"score {name}")
        result |= set_metrics(name, scores, pairs) | {f"{name.replace('-', '_')}_pairs": len(pairs)}
    return result


def format_pair_table(result: dict) -> str:
    """The sets' metrics (×100) in one table."""
    rows = [(name, str(result[f"{key}_pairs"]), metric, f"{100 * result[f'{key}_{metric}']:.2f}",
             "[{:.2f}, {:.2f}]".format(*(100 * v for v in result[f"{key}_{metric}_ci95"])) if
             f"{key}_{metric}_ci95" in result else "")
            for name in PAIR_SETS if f"{(key := name.replace('-', '_'))}_pairs" in result
            for metric in (("acc",) if name == "qqp-dev" else ("spearman", "pearson"))]
    if not rows:
        return ""
    heads = ("set", "pairs", "metric", "×100", "95% interval")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    line = lambda items: "| " + " | ".join(c.rjust(w) for c, w in zip(items, widths)) + " |"  # noqa: E731
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    return "\n".join([rule, line(heads), rule, *map(line, rows), rule])


def load_pair_model(name_or_path, vocab=None):
    """A cross-encoder (a sequence classifier's checkpoint) or, for anything else, a sentence encoder."""
    if is_cross_encoder(name_or_path):
        return CrossEncoder.from_pretrained(name_or_path, vocab=vocab)
    return SentenceEncoder.from_pretrained(name_or_path, vocab=vocab)


def run(config) -> dict:
    """``python -m bertcf.cross evaluate``: the sets of ``config`` (a ``CrossEvalConfig``; all are
    read before the model loads) scored by its model; a table on stdout, JSON when asked."""
    paths = pair_set_paths(config.data_dir, config.sts_dev, config.qqp_dev, config.senteval_dir)
    names = config.set_names() or [name for name in PAIR_SETS if paths[name].is_file()]
    if not names:
        raise DataError(f"no pair set found ({', '.join(str(p) for p in paths.values())}): set --data-dir, "
                        f"--sts-dev, --qqp-dev or --senteval-dir")
    sets = {name: read_pair_set(name, paths[name]) for name in names}
    device = resolve_device(config.device)
    model = load_pair_model(config.model, config.vocab).to(device)
    model.precision = resolve_precision(config.precision, device)
    result = evaluate_pair_sets(model, sets, config.batch_size, config.progress) | {
        "model": str(config.model), "kind": "cross-encoder" if isinstance(model, CrossEncoder) else "bi-encoder",
        "environment": environment.collect(device, model.precision)}
    print(format_pair_table(result))
    if config.json:
        write_json_atomic(config.json, result)
    return result
