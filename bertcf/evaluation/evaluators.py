"""SentEval's tasks as evaluator objects: STS by the cosine of raw vectors, transfer tasks by a
logistic-regression probe on frozen vectors (scikit-learn, as SentEval's ``usepytorch=False``).

Every evaluator has ``name``, ``main_metric``, ``sentences()`` (what it needs encoded) and
``__call__(embed) -> dict``, where ``embed(list of n sentences) -> [n, D]`` looks the vectors
up, so that :func:`bertcf.evaluation.senteval.evaluate` encodes each distinct sentence once for all tasks.
Scores are ×100, as SentEval and SimCSE print them.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score

from . import bootstrap
from .metrics import spearman

SEED = 1111  # SentEval's seed for the folds and the probe


class STSEvaluator:
    """Spearman ×100 between cos(u, v) and the gold scores (Agirre et al. 2012-16; Cer et al. 2017).

    ``subsets``: {subset name: list of PairExample (label = gold score)}. With several subsets
    (STS12-16) it reports SentEval's three aggregations: ``all`` (the subsets' pairs
    concatenated, the figure SimCSE's table shows), ``mean`` and ``wmean`` (the subsets'
    Spearman averaged, weighted by their number of pairs). One subset: ``all`` is its Spearman.

    ``ci95``: the 95% percentile bootstrap interval of ``all`` over ``resamples`` resamples of the
    pairs, each subset resampled within itself (:mod:`bertcf.evaluation.bootstrap`); the seed is a hash of
    the task's name, so every task has its own fixed stream whatever else runs. Also returned,
    for :func:`bertcf.evaluation.senteval.evaluate` to take out: ``replicates`` (np.ndarray [resamples]: ``all``
    on each resample) and ``pairs`` ({"scores": the cosines, "gold", "groups": each pair's
    subset}, lists [n] in the order of the ``all`` concatenation)."""

    main_metric = "all"

    def __init__(self, name: str, subsets: dict, resamples: int = 1000):
        self.name, self.subsets, self.resamples = name, subsets, resamples
        self.seed = zlib.crc32(name.encode())

    def sentences(self) -> list[str]:
        return [s for pairs in self.subsets.values() for p in pairs for s in (p.sentence1, p.sentence2)]

    def __call__(self, embed) -> dict:
        cosines, golds, groups, per_subset = [], [], [], {}
        for subset, pairs in self.subsets.items():
            # float64, as SentEval's numpy: float32 rounding can break or make ties among the cosines
            u, v = embed([p.sentence1 for p in pairs]).double(), embed([p.sentence2 for p in pairs]).double()
            cos = F.cosine_similarity(u, v, dim=-1)
            gold = [p.label for p in pairs]
            per_subset[subset] = {"spearman": 100 * spearman(cos, gold), "n": len(pairs)}
            cosines.append(cos)
            golds += gold
            groups += [subset] * len(pairs)
        cosines = torch.cat(cosines)
        values = np.array([r["spearman"] for r in per_subset.values()])
        weights = np.array([r["n"] for r in per_subset.values()])
        replicates = 100 * bootstrap.replicates(cosines, golds, "spearman", self.resamples, self.seed,
                                                groups if len(self.subsets) > 1 else None)
        return {"all": 100 * spearman(cosines, golds), "mean": float(values.mean()),
                "wmean": float(np.average(values, weights=weights)), "subsets": per_subset,
                "ci95": bootstrap.percentile_interval(replicates), "replicates": replicates,
                "pairs": {"scores": cosines.tolist(), "gold": golds, "groups": groups}}


@dataclass
class ProbeSettings:
    """How a probe is trained. ``c_grid`` None: the fixed ``c`` (fasttest); else the L2 strength
    (sklearn's C = 1/λ) is picked from SentEval's grid by an inner validation.

    The probe is scikit-learn's LogisticRegression, the model of SentEval's ``usepytorch=False``
    branch, with the installed scikit-learn's defaults (lbfgs; multinomial for TREC's 6 classes)
    except ``max_iter``: 1000, not 100, to give lbfgs room to converge. SimCSE's evaluation script
    uses SentEval's PyTorch probe (``usepytorch=True``: the same linear model trained by Adam with
    early stopping, with its own L2 grid), so its figures and ours need not agree to the decimal."""

    folds: int = 10
    c_grid: tuple[float, ...] | None = None
    c: float = 1.0
    max_iter: int = 1000

    def probe(self, c: float | None = None) -> LogisticRegression:
        return LogisticRegression(C=self.c if c is None else c, max_iter=self.max_iter, random_state=SEED)

    def kfold(self) -> StratifiedKFold:
        return StratifiedKFold(n_splits=self.folds, shuffle=True, random_state=SEED)

    def tuned(self):
        """The probe, wrapped in a k-fold grid search over C when there is a grid (SentEval's
        KFoldClassifier and the inner loop of its InnerKFoldClassifier)."""
        if self.c_grid is None:
            return self.probe()
        return GridSearchCV(self.probe(), {"C": list(self.c_grid)}, cv=self.kfold(), refit=best_c)


#: SentEval's C grids (validation.py, scikit-learn branch).
INNER_KFOLD_GRID = tuple(2.0 ** t for t in range(-2, 4))  # MR/CR/SUBJ/MPQA, SST2
KFOLD_GRID = tuple(2.0 ** t for t in range(-1, 6))        # TREC, MRPC


def percent(accuracy):
    """Accuracy ×100 rounded to 2 decimals, as SentEval rounds every score it compares or averages."""
    return np.round(100 * np.asarray(accuracy, dtype=np.float64), 2)


def best_c(cv_results: dict) -> int:
    """GridSearchCV's refit rule as SentEval's: the first C of the grid whose mean validation
    accuracy, ×100 rounded to 2 decimals, is the highest."""
    return int(np.argmax(percent(cv_results["mean_test_score"])))


def senteval_order(items: list, labels: list[int]) -> tuple[list, list[int]]:
    """``items`` and ``labels`` in the order SentEval's task code feeds its classifier: sorted by
    the number of words (of each sentence of a pair, in turn), then the label; ties keep the file's
    order. The shuffled stratified folds depend on this order, so the same order gives SentEval's folds."""
    def key(i):
        item = items[i]  # a sentence, or a PairExample
        if isinstance(item, str):
            return len(item.split()), labels[i]
        return len(item.sentence1.split()), len(item.sentence2.split()), labels[i]
    order = sorted(range(len(items)), key=key)
    return [items[i] for i in order], [labels[i] for i in order]


#: The probe's features of a pair (u, v), by name: SentEval's MRPC task uses [|u - v|, u * v]
#: (mrpc.py); "full" adds u and v (InferSent's NLI classifier's features), as this project's MRPC
#: figures did before SentEval's became the default.
PAIR_FEATURES = {"senteval": "[|u-v|, u*v]", "full": "[u, v, |u-v|, u*v]"}


def pair_features(u: torch.Tensor, v: torch.Tensor, kind: str = "senteval") -> torch.Tensor:
    """[N, D] x [N, D] -> [N, 2D] (senteval: [|u - v|, u * v]) or [N, 4D] (full: [u, v, |u - v|, u * v])."""
    if kind not in PAIR_FEATURES:
        raise ValueError(f"pair features must be one of {', '.join(PAIR_FEATURES)}, not {kind!r}")
    both = [(u - v).abs(), u * v]
    return torch.cat([u, v, *both] if kind == "full" else both, dim=-1)


def _features(x: torch.Tensor) -> np.ndarray:
    return x.double().numpy()


class CVClassificationEvaluator:
    """MR, CR, SUBJ, MPQA (SentEval's InnerKFoldClassifier): accuracy ×100 of k-fold
    cross-validation over all sentences, the mean of the folds' rounded accuracies; in each outer
    fold, an inner k-fold on the training part picks C (``settings.c_grid``)."""

    main_metric = "accuracy"

    def __init__(self, name: str, sentences: list[str], labels: list[int], settings: ProbeSettings):
        self._sentences, labels = senteval_order(sentences, labels)
        self.name, self.labels, self.settings = name, np.array(labels), settings

    def sentences(self) -> list[str]:
        return self._sentences

    def __call__(self, embed) -> dict:
        x = _features(embed(self._sentences))
        scores = cross_val_score(self.settings.tuned(), x, self.labels, cv=self.settings.kfold())
        return {"accuracy": float(percent(scores).mean()), "n": len(self.labels)}


class SplitClassificationEvaluator:
    """SST2: C picked on the dev split (SentEval's SplitClassifier), accuracy ×100 on test."""

    main_metric = "accuracy"

    def __init__(self, name: str, splits: dict, settings: ProbeSettings):
        self.name, self.splits, self.settings = name, splits, settings  # splits: {train|dev|test: (sents, labels)}

    def sentences(self) -> list[str]:
        return [s for sentences, _ in self.splits.values() for s in sentences]

    def __call__(self, embed) -> dict:
        (x, y), (xd, yd), (xt, yt) = [(_features(embed(s)), np.array(l)) for s, l in
                                      (self.splits[k] for k in ("train", "dev", "test"))]
        c = None
        if self.settings.c_grid is not None:
            dev = [self.settings.probe(c).fit(x, y).score(xd, yd) for c in self.settings.c_grid]
            c = self.settings.c_grid[int(np.argmax(percent(dev)))]
        probe = self.settings.probe(c).fit(x, y)
        return {"accuracy": 100 * probe.score(xt, yt), "n": len(yt)}


class TrainTestClassificationEvaluator:
    """TREC and MRPC: C picked by k-fold on train (SentEval's KFoldClassifier), accuracy ×100 on
    test. With ``pairs`` (MRPC: "senteval" or "full") the items are PairExamples, the probe sees
    :func:`pair_features` of that kind of their vectors, and F1 ×100 is reported too."""

    main_metric = "accuracy"

    def __init__(self, name: str, train: tuple, test: tuple, settings: ProbeSettings, pairs: str | None = None):
        self.name, self.settings, self.pairs = name, settings, pairs
        self.train, self.test = senteval_order(*train), senteval_order(*test)

    def sentences(self) -> list[str]:
        if self.pairs:
            return [s for items, _ in (self.train, self.test) for p in items for s in (p.sentence1, p.sentence2)]
        return list(self.train[0]) + list(self.test[0])

    def features(self, items, embed) -> np.ndarray:
        """The probe's input for ``items``: their vectors, or the pair features of their pairs."""
        if not self.pairs:
            return _features(embed(items))
        u, v = embed([p.sentence1 for p in items]), embed([p.sentence2 for p in items])
        return _features(pair_features(u, v, self.pairs))

    def __call__(self, embed) -> dict:
        x, y = self.features(self.train[0], embed), np.array(self.train[1])
        xt, yt = self.features(self.test[0], embed), np.array(self.test[1])
        probe = self.settings.tuned().fit(x, y)
        predicted = probe.predict(xt)
        result = {"accuracy": 100 * float((predicted == yt).mean()), "n": len(yt)}
        if self.pairs:
            result["f1"] = 100 * float(f1_score(yt, predicted))
            result["features"] = self.pairs
        return result
