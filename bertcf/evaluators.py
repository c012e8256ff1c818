"""SentEval's tasks as evaluator objects: STS by the cosine of raw vectors, transfer tasks by a
logistic-regression probe on frozen vectors (scikit-learn, as SentEval's ``usepytorch=False``).

Every evaluator has ``name``, ``main_metric``, ``sentences()`` (what it needs encoded) and
``__call__(embed) -> dict``, where ``embed(list of n sentences) -> [n, D]`` looks the vectors
up, so that :func:`bertcf.evaluate.evaluate` encodes each distinct sentence once for all tasks.
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
from .evaluation import spearman

SEED = 1111  # SentEval's seed for the folds and the probe


class STSEvaluator:
    """Spearman ×100 between cos(u, v) and the gold scores (Agirre et al. 2012-16; Cer et al. 2017).

    ``subsets``: {subset name: list of PairExample (label = gold score)}. With several subsets
    (STS12-16) it reports SentEval's three aggregations: ``all`` (the subsets' pairs
    concatenated, the figure SimCSE's table shows), ``mean`` and ``wmean`` (the subsets'
    Spearman averaged, weighted by their number of pairs). One subset: ``all`` is its Spearman.

    ``ci95``: the 95% percentile bootstrap interval of ``all`` over ``resamples`` resamples of the
    pairs, each subset resampled within itself (:mod:`bertcf.bootstrap`); the seed is a hash of
    the task's name, so every task has its own fixed stream whatever else runs. Also returned,
    for :func:`bertcf.evaluate.evaluate` to take out: ``replicates`` (np.ndarray [resamples]: ``all``
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
    (sklearn's C = 1/λ) is picked from SentEval's grid by an inner validation."""

    folds: int = 10
    c_grid: tuple[float, ...] | None = None
    c: float = 1.0
    max_iter: int = 1000

    def probe(self, c: float | None = None) -> LogisticRegression:
        return LogisticRegression(C=self.c if c is None else c, max_iter=self.max_iter, random_state=SEED)

    def kfold(self) -> StratifiedKFold:
        return StratifiedKFold(n_splits=self.folds, shuffle=True, random_state=SEED)

    def tuned(self):
        """The probe, wrapped in a k-fold grid search over C when there is a grid."""
        if self.c_grid is None:
            return self.probe()
        return GridSearchCV(self.probe(), {"C": list(self.c_grid)}, cv=self.kfold())


#: SentEval's C grids (validation.py, scikit-learn branch).
INNER_KFOLD_GRID = tuple(2.0 ** t for t in range(-2, 4))  # MR/CR/SUBJ/MPQA, SST2
KFOLD_GRID = tuple(2.0 ** t for t in range(-1, 6))        # TREC, MRPC


def _features(x: torch.Tensor) -> np.ndarray:
    return x.double().numpy()


class CVClassificationEvaluator:
    """MR, CR, SUBJ, MPQA: accuracy ×100 of k-fold cross-validation over all sentences; in each
    outer fold, an inner k-fold on the training part picks C (``settings.c_grid``)."""

    main_metric = "accuracy"

    def __init__(self, name: str, sentences: list[str], labels: list[int], settings: ProbeSettings):
        self.name, self._sentences, self.labels, self.settings = name, sentences, np.array(labels), settings

    def sentences(self) -> list[str]:
        return self._sentences

    def __call__(self, embed) -> dict:
        x = _features(embed(self._sentences))
        scores = cross_val_score(self.settings.tuned(), x, self.labels, cv=self.settings.kfold())
        return {"accuracy": 100 * float(scores.mean()), "n": len(self.labels)}


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
            c = self.settings.c_grid[int(np.argmax(dev))]
        probe = self.settings.probe(c).fit(x, y)
        return {"accuracy": 100 * probe.score(xt, yt), "n": len(yt)}


class TrainTestClassificationEvaluator:
    """TREC and MRPC: C picked by k-fold on train (SentEval's KFoldClassifier), accuracy ×100 on
    test. With pairs (MRPC) the features are [u, v, |u - v|, u * v] and F1 ×100 is reported too."""

    main_metric = "accuracy"

    def __init__(self, name: str, train: tuple, test: tuple, settings: ProbeSettings, pairs: bool = False):
        self.name, self.train, self.test, self.settings, self.pairs = name, train, test, settings, pairs

    def sentences(self) -> list[str]:
        if self.pairs:
            return [s for items, _ in (self.train, self.test) for p in items for s in (p.sentence1, p.sentence2)]
        return list(self.train[0]) + list(self.test[0])

    def _x(self, items, embed) -> np.ndarray:
        if not self.pairs:
            return _features(embed(items))
        u, v = embed([p.sentence1 for p in items]), embed([p.sentence2 for p in items])
        return _features(torch.cat([u, v, (u - v).abs(), u * v], dim=-1))

    def __call__(self, embed) -> dict:
        x, y = self._x(self.train[0], embed), np.array(self.train[1])
        xt, yt = self._x(self.test[0], embed), np.array(self.test[1])
        probe = self.settings.tuned().fit(x, y)
        predicted = probe.predict(xt)
        result = {"accuracy": 100 * float((predicted == yt).mean()), "n": len(yt)}
        if self.pairs:
            result["f1"] = 100 * float(f1_score(yt, predicted))
        return result
