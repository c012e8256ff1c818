"""SentEval's tasks as evaluator objects: STS by the cosine of raw vectors, transfer tasks by a
linear probe on frozen vectors: SentEval's own PyTorch probe (``usepytorch=True``,
:mod:`bertcf.evaluation.probe`) or scikit-learn's logistic regression (SentEval's
``usepytorch=False``, :class:`ProbeSettings`).

Every evaluator has ``name``, ``main_metric``, ``sentences()`` (what it needs encoded) and
``__call__(embed) -> dict``, where ``embed(list of n sentences) -> [n, D]`` looks the vectors
up, so that :func:`bertcf.evaluation.senteval.evaluate` encodes each distinct sentence once for all tasks.
Scores are ×100, as SentEval and SimCSE print them. A probe is an object with SentEval's three
validations: ``cross_validate(x, y)``, ``train_test(x, y, xt, yt)`` and ``split(x, y, xd, yd, xt,
yt)``, each returning ``accuracy`` and ``devacc`` (the validation score that chose its
regularisation; None where nothing was chosen) and ``train_test`` also ``predicted``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from joblib import Parallel, delayed
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_validate

from . import bootstrap
from .metrics import spearman
from .probe import percent

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
    """The scikit-learn probe (``--probe sklearn``) and how it is trained. ``c_grid`` None: the fixed
    ``c`` (fasttest); else the L2 strength (sklearn's C = 1/λ) is picked from SentEval's grid by an
    inner validation. ``n_jobs``: processes for the fits of a grid search (joblib; None: one).

    The probe is scikit-learn's LogisticRegression, the model of SentEval's ``usepytorch=False``
    branch, with the installed scikit-learn's defaults (lbfgs; multinomial for TREC's 6 classes)
    except ``max_iter``: 1000, not 100, to give lbfgs room to converge. SentEval's own examples and
    SimCSE's evaluation use its PyTorch probe instead (``--probe senteval``,
    :mod:`bertcf.evaluation.probe`: the same linear model trained by Adam with early stopping, with
    its own L2 grid); this one's figures and those need not agree to the decimal."""

    folds: int = 10
    c_grid: tuple[float, ...] | None = None
    c: float = 1.0
    max_iter: int = 1000
    n_jobs: int | None = None
    name = "sklearn"

    def probe(self, c: float | None = None) -> LogisticRegression:
        return LogisticRegression(C=self.c if c is None else c, max_iter=self.max_iter, random_state=SEED)

    def kfold(self) -> StratifiedKFold:
        return StratifiedKFold(n_splits=self.folds, shuffle=True, random_state=SEED)

    def tuned(self, n_jobs: int | None = None):
        """The probe, wrapped in a k-fold grid search over C when there is a grid (SentEval's
        KFoldClassifier and the inner loop of its InnerKFoldClassifier)."""
        if self.c_grid is None:
            return self.probe()
        return GridSearchCV(self.probe(), {"C": list(self.c_grid)}, cv=self.kfold(), refit=best_c, n_jobs=n_jobs)

    def cross_validate(self, x, y) -> dict:
        """SentEval's InnerKFoldClassifier: the mean of the k folds' rounded test accuracies; in each
        fold an inner k-fold grid search picks C (its best rounded score: ``devacc``, averaged)."""
        runs = cross_validate(self.tuned(), _features(x), np.asarray(y), cv=self.kfold(), n_jobs=self.n_jobs,
                              return_estimator=self.c_grid is not None)
        devacc = (float(np.mean([_best_score(e) for e in runs["estimator"]])) if self.c_grid is not None else None)
        return {"accuracy": float(percent(runs["test_score"]).mean()), "devacc": devacc}

    def train_test(self, x, y, xt, yt) -> dict:
        """SentEval's KFoldClassifier: C by k-fold on train, the probe refitted on train, scored on test."""
        probe = self.tuned(self.n_jobs).fit(_features(x), np.asarray(y))
        predicted = probe.predict(_features(xt))
        devacc = _best_score(probe) if self.c_grid is not None else None
        return {"accuracy": 100 * float((predicted == np.asarray(yt)).mean()), "devacc": devacc,
                "predicted": predicted}

    def split(self, x, y, xd, yd, xt, yt) -> dict:
        """SentEval's SplitClassifier: C picked on dev (the first best rounded score), scored on test."""
        (x, y), (xd, yd), (xt, yt) = [(_features(a), np.asarray(b)) for a, b in ((x, y), (xd, yd), (xt, yt))]
        c, devacc = None, None
        if self.c_grid is not None:
            fit = delayed(lambda c: self.probe(c).fit(x, y).score(xd, yd))
            dev = percent(Parallel(n_jobs=self.n_jobs)(fit(c) for c in self.c_grid))
            c, devacc = self.c_grid[int(np.argmax(dev))], float(dev.max())
        return {"accuracy": 100 * self.probe(c).fit(x, y).score(xt, yt), "devacc": devacc}


#: SentEval's C grids (validation.py, scikit-learn branch).
INNER_KFOLD_GRID = tuple(2.0 ** t for t in range(-2, 4))  # MR/CR/SUBJ/MPQA, SST2
KFOLD_GRID = tuple(2.0 ** t for t in range(-1, 6))        # TREC, MRPC


def _best_score(search: GridSearchCV) -> float:
    """The rounded mean validation accuracy of the C a grid search chose (SentEval's ``devacc``)."""
    return float(percent(search.cv_results_["mean_test_score"][search.best_index_]))


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


def _features(x) -> np.ndarray:
    """The scikit-learn probe's input: float64, as SentEval's numpy arrays are."""
    return x.double().numpy() if torch.is_tensor(x) else np.asarray(x, dtype=np.float64)


class CVClassificationEvaluator:
    """MR, CR, SUBJ, MPQA (SentEval's InnerKFoldClassifier): accuracy ×100 of k-fold
    cross-validation over all sentences, the mean of the folds' rounded accuracies; in each outer
    fold, an inner k-fold on the training part picks the probe's L2 strength (``probe``: a
    :class:`ProbeSettings` or a :class:`~bertcf.evaluation.probe.SentEvalProbe`)."""

    main_metric = "accuracy"

    def __init__(self, name: str, sentences: list[str], labels: list[int], settings):
        self._sentences, labels = senteval_order(sentences, labels)
        self.name, self.labels, self.settings = name, np.array(labels), settings

    def sentences(self) -> list[str]:
        return self._sentences

    def __call__(self, embed) -> dict:
        scores = self.settings.cross_validate(embed(self._sentences), self.labels)
        return {"accuracy": scores["accuracy"], "devacc": scores["devacc"], "n": len(self.labels)}


class SplitClassificationEvaluator:
    """SST2: the L2 strength picked on the dev split (SentEval's SplitClassifier), accuracy ×100 on
    test. Each split is in SentEval's order (sst.py sorts them), which its probe's data order follows."""

    main_metric = "accuracy"

    def __init__(self, name: str, splits: dict, settings):
        # splits: {train|dev|test: (sentences, labels)}
        self.name, self.settings = name, settings
        self.splits = {k: senteval_order(*v) for k, v in splits.items()}

    def sentences(self) -> list[str]:
        return [s for sentences, _ in self.splits.values() for s in sentences]

    def __call__(self, embed) -> dict:
        parts = [(embed(s), np.array(y)) for s, y in (self.splits[k] for k in ("train", "dev", "test"))]
        scores = self.settings.split(*(item for part in parts for item in part))
        return {"accuracy": scores["accuracy"], "devacc": scores["devacc"], "n": len(parts[2][1])}


class TrainTestClassificationEvaluator:
    """TREC and MRPC: the L2 strength picked by k-fold on train (SentEval's KFoldClassifier),
    accuracy ×100 on test. With ``pairs`` (MRPC: "senteval" or "full") the items are PairExamples,
    the probe sees :func:`pair_features` of that kind of their vectors, and F1 ×100 is reported too."""

    main_metric = "accuracy"

    def __init__(self, name: str, train: tuple, test: tuple, settings, pairs: str | None = None):
        self.name, self.settings, self.pairs = name, settings, pairs
        self.train, self.test = senteval_order(*train), senteval_order(*test)

    def sentences(self) -> list[str]:
        if self.pairs:
            return [s for items, _ in (self.train, self.test) for p in items for s in (p.sentence1, p.sentence2)]
        return list(self.train[0]) + list(self.test[0])

    def features(self, items, embed) -> torch.Tensor:
        """The probe's input for ``items``: their vectors, or the pair features of their pairs."""
        if not self.pairs:
            return embed(items)
        return pair_features(embed([p.sentence1 for p in items]), embed([p.sentence2 for p in items]), self.pairs)

    def __call__(self, embed) -> dict:
        yt = np.array(self.test[1])
        scores = self.settings.train_test(self.features(self.train[0], embed), np.array(self.train[1]),
                                          self.features(self.test[0], embed), yt)
        result = {"accuracy": scores["accuracy"], "devacc": scores["devacc"], "n": len(yt)}
        if self.pairs:
            f1 = 100 * float(f1_score(yt, scores["predicted"]))
            result["f1"] = float(np.round(f1, 2)) if self.settings.name == "senteval" else f1  # SentEval rounds it
            result["features"] = self.pairs
        return result
