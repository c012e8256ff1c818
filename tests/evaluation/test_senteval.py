"""SentEval's file formats, the STS aggregations, the transfer probes and `python -m bertcf.evaluate`."""
from __future__ import annotations

import json
import logging
import shutil
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import senteval_sentence as sentence
from helpers import write_lines as write
from helpers import write_senteval, write_sts_year
from scipy import stats
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from bertcf.data import senteval as se
from bertcf.data.tasks import PairExample
from bertcf.errors import DataError, UsageError
from bertcf.commands.evaluate import main as cli
from bertcf.evaluation.bootstrap import interval
from bertcf.evaluation.evaluators import (
    INNER_KFOLD_GRID,
    KFOLD_GRID,
    SEED,
    CVClassificationEvaluator,
    ProbeSettings,
    SplitClassificationEvaluator,
    STSEvaluator,
    TrainTestClassificationEvaluator,
    best_c,
)
from bertcf.evaluation.probe import FASTTEST
from bertcf.evaluation.senteval import evaluate, format_table, parse_tasks

SHARED_SENTEVAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "senteval"


# ---- readers ----------------------------------------------------------------------------------
def test_sts_year_reader_skips_empty_scores_and_ignores_non_subsets(tmp_path):
    scores = write_sts_year(tmp_path, "STS13")
    year = se.read_sts_year(tmp_path, "STS13")
    assert list(year) == ["FNWN", "headlines", "OnWN"]  # not "ALL"
    for subset, pairs in year.items():
        assert [p.label for p in pairs] == scores[subset]
    first = year["FNWN"][0]
    assert first.sentence1 == "a man and the woman . 0" and first.id == "STS.input.FNWN.txt:1"


def test_stsb_sick_readers(tmp_path):
    write_senteval(tmp_path)
    stsb = se.read_stsb(tmp_path / se.STSB_FILES["test"])
    assert len(stsb) == 6 and stsb[2].label == 1.6 and stsb[2].sentence2 == sentence(3).replace("  ", " ")
    sick = se.read_sick(tmp_path / se.SICK_FILES["test"])
    assert len(sick) == 6 and sick[0].id == "0" and sick[1].label == pytest.approx(1.7)


def test_transfer_readers(tmp_path):
    write_senteval(tmp_path)
    sentences, labels = se.read_binary(*(tmp_path / f for f in se.BINARY_FILES["MR"]))
    assert len(sentences) == 20 and labels == [1] * 10 + [0] * 10 and sentences[0].startswith("good a man and")
    sst, sst_labels = se.read_sst2(tmp_path / se.SST2_FILES["dev"])
    assert sst[1] == "good " + sentence(1).replace("  ", " ") and sst_labels[:2] == [0, 1]
    trec, trec_labels = se.read_trec(tmp_path / se.TREC_FILES["train"])
    assert trec[0].startswith("what is a man") and trec_labels[:7] == [0, 1, 2, 3, 4, 5, 0]
    pairs, mrpc_labels = se.read_mrpc(tmp_path / se.MRPC_FILES["test"])
    assert len(pairs) == 20 and mrpc_labels[:2] == [0, 1] and pairs[0].id == "0-100"


def test_trec_reads_latin1_questions_and_six_coarse_classes(tmp_path):
    """TREC's training file is Latin-1 (byte 0xF0 in one question): read as SentEval reads it, the
    question keeps its character; the label is the coarse class before the colon, SentEval's index."""
    path = write(tmp_path / se.TREC_FILES["train"], [
        "LOC:city Which city has the oldest relationship as a sister\xf0city with Los Angeles ?",
        "HUM:ind Who  founded the Caf\xe9 Procope ?", "ABBR:exp What does NASA stand for ?",
        "NUM:date When did the war end ?", "DESC:def What is a fjord ?", "ENTY:animal What is the fastest bird ?"],
        "latin-1")
    with pytest.raises(UnicodeDecodeError):
        path.read_bytes().decode("utf-8")  # the file is not UTF-8: a UTF-8 reader would fail or garble it
    sentences, labels = se.read_trec(path)
    assert sentences[:2] == ["Which city has the oldest relationship as a sister\u00f0city with Los Angeles ?",
                             "Who founded the Caf\u00e9 Procope ?"]
    assert labels == [4, 3, 0, 5, 1, 2]  # SentEval's tgt2idx: ABBR 0, DESC 1, ENTY 2, HUM 3, LOC 4, NUM 5
    assert se.TREC_CLASSES == ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")


@pytest.mark.parametrize("relative, line, message", [
    (se.STSB_FILES["test"], "x\ty\tz\t1\tfive\ta\tb", "line 2: score 'five' is not a number"),
    (se.STSB_FILES["test"], "x\ty\tz\t1\t2.0\ta", "line 2: expected at least 7 tab-separated fields, found 6"),
    (se.SST2_FILES["test"], "a fine film\t3", "line 2: label '3' is not one of 0, 1"),
    (se.TREC_FILES["test"], "WHAT:x is it ?", "line 2: label 'WHAT' is not one of ABBR"),
    (se.TREC_FILES["test"], "no colon here", "line 2: expected 'CLASS:fine question'"),
])
def test_malformed_line_names_file_and_line(tmp_path, relative, line, message):
    write_senteval(tmp_path)
    path = tmp_path / relative
    lines = path.read_text(encoding="latin-1").splitlines()
    write(path, lines[:1] + [line] + lines[2:], "latin-1")
    reader = {se.STSB_FILES["test"]: se.read_stsb, se.SST2_FILES["test"]: se.read_sst2}.get(relative, se.read_trec)
    with pytest.raises(DataError, match=str(path).replace(".", r"\.") + ".*" + message.split(": ")[0]) as error:
        reader(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_sts_input_and_gold_lengths_must_agree(tmp_path):
    write_sts_year(tmp_path, "STS13")
    gs = se.sts_year_dir(tmp_path, "STS13") / "STS.gs.OnWN.txt"
    write(gs, gs.read_text().splitlines()[:-1])
    with pytest.raises(DataError, match="STS.gs.OnWN.txt has 5 lines but .*STS.input.OnWN.txt has 6"):
        se.read_sts_year(tmp_path, "STS13")


# ---- the STS aggregations ----------------------------------------------------------------------
def test_sts_aggregations_by_hand(tmp_path):
    """all: Spearman over the concatenated subsets; mean / wmean: of the subsets' Spearman."""
    write_sts_year(tmp_path, "STS15", n=5)
    year = se.read_sts_year(tmp_path, "STS15")
    rng = np.random.default_rng(0)
    table = {s: torch.tensor(rng.normal(size=8), dtype=torch.float32)
             for pairs in year.values() for p in pairs for s in (p.sentence1, p.sentence2)}
    result = STSEvaluator("STS15", year)(lambda batch: torch.stack([table[s] for s in batch]))

    def cos(p):
        a, b = table[p.sentence1].double().numpy(), table[p.sentence2].double().numpy()
        return a @ b / np.linalg.norm(a) / np.linalg.norm(b)

    per = {k: 100 * stats.spearmanr([cos(p) for p in v], [p.label for p in v]).statistic for k, v in year.items()}
    sizes = {k: len(v) for k, v in year.items()}
    every = [p for v in year.values() for p in v]
    assert result["all"] == pytest.approx(100 * stats.spearmanr([cos(p) for p in every],
                                                                [p.label for p in every]).statistic, abs=1e-4)
    assert result["mean"] == pytest.approx(sum(per.values()) / len(per), abs=1e-4)
    assert result["wmean"] == pytest.approx(sum(per[k] * sizes[k] for k in per) / sum(sizes.values()), abs=1e-4)
    assert {k: r["n"] for k, r in result["subsets"].items()} == sizes == {
        "answers-forums": 4, "answers-students": 5, "belief": 6, "headlines": 7, "images": 8}
    assert len({round(result[k], 6) for k in ("all", "mean", "wmean")}) == 3  # the three really differ
    # The interval: "all" bootstrapped over the pairs, each subset resampled within itself.
    groups = [k for k, v in year.items() for _ in v]
    assert result["pairs"] == {"scores": pytest.approx([cos(p) for p in every], abs=1e-12),
                               "gold": [p.label for p in every], "groups": groups}
    pairs = result["pairs"]
    expected = interval(pairs["scores"], pairs["gold"], "spearman", 1000, zlib.crc32(b"STS15"), groups)
    assert result["ci95"] == pytest.approx([100 * v for v in expected])
    assert result["replicates"].shape == (1000,) and result["ci95"] == pytest.approx(
        np.percentile(result["replicates"], [2.5, 97.5]).tolist())


# ---- the probes ----------------------------------------------------------------------------------
def _separable(n: int = 40, dim: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = [i % 2 for i in range(n)]
    vectors = {f"s{i}": torch.tensor(rng.normal(size=dim) + 4.0 * (2 * labels[i] - 1), dtype=torch.float32)
               for i in range(n)}
    return vectors, [f"s{i}" for i in range(n)], labels


@pytest.mark.parametrize("features", ["senteval", "full"])
@pytest.mark.parametrize("settings", [ProbeSettings(folds=5), ProbeSettings(folds=4, c_grid=(0.25, 1.0, 4.0)),
                                      replace(FASTTEST, folds=4, max_epoch=20)])
def test_probes_on_separable_vectors(settings, features):
    vectors, names, labels = _separable()
    embed = lambda batch: torch.stack([vectors[s] for s in batch])  # noqa: E731
    assert CVClassificationEvaluator("toy", names, labels, settings)(embed)["accuracy"] == 100.0
    split = {"train": (names[:20], labels[:20]), "dev": (names[20:30], labels[20:30]), "test": (names[30:], labels[30:])}
    result = SplitClassificationEvaluator("toy", split, settings)(embed)
    assert result["accuracy"] == 100.0 and result["n"] == 10
    assert result["devacc"] == (None if settings == ProbeSettings(folds=5) else 100.0)  # no grid, no validation
    assert TrainTestClassificationEvaluator("toy", (names[:28], labels[:28]), (names[28:], labels[28:]),
                                            settings)(embed)["accuracy"] == 100.0
    # Pairs: label 1 iff both sentences are on the same side; both feature sets make it linear (u*v).
    pairs = [PairExample(str(i), names[i], names[(i + 1 + (i % 2)) % 40], 0.0) for i in range(40)]
    pair_labels = [int(labels[int(p.id)] == labels[names.index(p.sentence2)]) for p in pairs]
    result = TrainTestClassificationEvaluator("pairs", (pairs[:30], pair_labels[:30]), (pairs[30:], pair_labels[30:]),
                                              settings, pairs=features)(embed)
    if isinstance(settings, ProbeSettings):
        assert result["accuracy"] == 100.0 and result["f1"] == 100.0 and result["features"] == features
    else:  # 30 training pairs: SentEval's probe stops early on the one pair 5% holds out, a little short of 100
        assert result["accuracy"] >= 80.0 and result["features"] == features


def test_probe_is_at_chance_on_random_labels():
    vectors, names, _ = _separable()
    labels = list(np.random.default_rng(1).integers(0, 2, size=40))
    embed = lambda batch: torch.stack([vectors[s] for s in batch])  # noqa: E731
    assert CVClassificationEvaluator("toy", names, labels, ProbeSettings(folds=5))(embed)["accuracy"] < 80.0


# ---- the probes against SentEval's own procedure (validation.py, scikit-learn branch) -------------
# The references below are written from SentEval's loops (binary.py/trec.py/mrpc.py sort the items,
# then InnerKFoldClassifier / KFoldClassifier): explicit loops over the folds and the C grid, scores
# ×100 rounded to 2 decimals before they are compared or averaged, the first best C. The evaluators
# get the items in file order and must reproduce the numbers through GridSearchCV/cross_val_score.
def _reference_probe(c: float, x, y):
    return LogisticRegression(C=c, max_iter=ProbeSettings.max_iter, random_state=SEED).fit(x, y)


def _reference_best_c(x, y, grid, k: int) -> float:
    folds = StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED)
    scores = [round(100 * np.mean([_reference_probe(c, x[a], y[a]).score(x[b], y[b]) for a, b in folds.split(x, y)]), 2)
              for c in grid]
    return grid[int(np.argmax(scores))]


def _reference_inner_kfold(x, y, grid, k: int) -> float:
    """SentEval's InnerKFoldClassifier: the mean of the outer folds' rounded test accuracies."""
    accuracies = []
    for train, test in StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED).split(x, y):
        c = _reference_best_c(x[train], y[train], grid, k)
        accuracies.append(round(100 * _reference_probe(c, x[train], y[train]).score(x[test], y[test]), 2))
    return float(np.mean(accuracies))


def _noisy_sentences(n: int, dim: int, classes: int, seed: int):
    """Sentences of 1-6 words (so SentEval's sort by length moves them), labels, and vectors
    with a weak class signal (so the regularisation matters and C is really chosen)."""
    rng = np.random.default_rng(seed)
    labels = [int(v) for v in rng.integers(0, classes, size=n)]
    sentences = [" ".join(f"w{i}" for _ in range(int(rng.integers(1, 7)))) + f" x{i}" for i in range(n)]
    means = rng.normal(size=(classes, dim))
    vectors = {s: torch.tensor(0.6 * means[y] + rng.normal(size=dim), dtype=torch.float32)
               for s, y in zip(sentences, labels)}
    return sentences, labels, vectors


def _sorted_like_senteval(keys, *columns):
    """SentEval's ``sorted(zip(...), key=(lengths..., label))``: keys are tuples of lengths."""
    rows = sorted(zip(*columns), key=lambda row: (*keys(row), row[-1]))
    return [list(c) for c in zip(*rows)]


def test_cv_probe_is_senteval_inner_kfold():
    sentences, labels, vectors = _noisy_sentences(90, 12, 2, seed=3)
    embed = lambda batch: torch.stack([vectors[s] for s in batch])  # noqa: E731
    ours = CVClassificationEvaluator("toy", sentences, labels, ProbeSettings(folds=3, c_grid=INNER_KFOLD_GRID))(embed)
    words, y = _sorted_like_senteval(lambda row: (len(row[0].split()),), sentences, labels)
    x = embed(words).double().numpy()
    expected = _reference_inner_kfold(x, np.array(y), INNER_KFOLD_GRID, 3)
    assert ours["accuracy"] == pytest.approx(expected, abs=1e-9)
    # the order matters: the same procedure on the file's order gives other folds and another score
    unsorted = _reference_inner_kfold(embed(sentences).double().numpy(), np.array(labels), INNER_KFOLD_GRID, 3)
    assert unsorted != pytest.approx(expected, abs=1e-9)


def _toy_pairs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    sentences, _, vectors = _noisy_sentences(n, 10, 2, seed=seed)
    pairs, labels = [], []
    for i in range(n):
        j = int(rng.integers(0, n))
        u, v = vectors[sentences[i]], vectors[sentences[j]]
        labels.append(int(float(torch.dot(u, v)) + rng.normal() > 0))  # paraphrase-like: a noisy u·v
        pairs.append(PairExample(str(i), sentences[i], sentences[j], float(labels[-1])))
    return pairs, labels, vectors


def test_mrpc_features_are_sentevals_formula():
    """[|u - v|, u * v] as mrpc.py's ``np.c_[np.abs(A - B), A * B]`` (and "full" with u, v first),
    on a built example with known vectors."""
    vectors = {"a": torch.tensor([1.0, -2.0, 0.5]), "b": torch.tensor([3.0, 1.0, -0.5]),
               "c": torch.tensor([0.0, 4.0, 2.0])}
    pairs = [PairExample("0", "a", "b", 1.0), PairExample("1", "c", "a", 0.0)]
    embed = lambda batch: torch.stack([vectors[s] for s in batch])  # noqa: E731
    a, b = np.array([[1.0, -2.0, 0.5], [0.0, 4.0, 2.0]]), np.array([[3.0, 1.0, -0.5], [1.0, -2.0, 0.5]])
    by_hand = np.array([[2.0, 3.0, 1.0, 3.0, -2.0, -0.25], [1.0, 6.0, 1.5, 0.0, -8.0, 1.0]])
    assert np.array_equal(by_hand, np.c_[np.abs(a - b), a * b])
    def features(kind):
        evaluator = TrainTestClassificationEvaluator("MRPC", (pairs, [1, 0]), (pairs, [1, 0]), ProbeSettings(), kind)
        return evaluator.features(pairs, embed)
    assert np.array_equal(features("senteval"), by_hand)
    assert np.array_equal(features("full"), np.c_[a, b, by_hand])
    with pytest.raises(ValueError, match="one of senteval, full, not 'diff'"):
        features("diff")


@pytest.mark.parametrize("task, seed", [("MRPC", 6), ("TREC", 8)])  # seeds where the order changes C
def test_train_test_probe_is_senteval_kfold_classifier(task, seed):
    """SentEval's KFoldClassifier: C by k-fold on train (items sorted as mrpc.py / trec.py sort
    them), the probe refitted on all of train, accuracy (and MRPC's F1) on test."""
    from sklearn.metrics import f1_score
    settings = ProbeSettings(folds=3, c_grid=KFOLD_GRID)
    if task == "MRPC":
        items, labels, vectors = _toy_pairs(120, seed=seed)
        keys = lambda row: (len(row[0].sentence1.split()), len(row[0].sentence2.split()))  # noqa: E731
    else:  # TREC: several classes
        items, labels, vectors = _noisy_sentences(120, 12, 3, seed=seed)
        keys = lambda row: (len(row[0].split()),)  # noqa: E731
    embed = lambda batch: torch.stack([vectors[s] for s in batch])  # noqa: E731
    train, test = (items[:80], labels[:80]), (items[80:], labels[80:])
    evaluator = TrainTestClassificationEvaluator(task, train, test, settings,
                                                 pairs="senteval" if task == "MRPC" else None)
    ours = evaluator(embed)

    def features(rows):
        if task == "TREC":
            return embed(rows).double().numpy()
        a = embed([p.sentence1 for p in rows]).double().numpy()
        b = embed([p.sentence2 for p in rows]).double().numpy()
        return np.c_[np.abs(a - b), a * b]
    def reference(train_rows, train_labels):
        x, y = features(train_rows), np.array(train_labels)
        return _reference_probe(_reference_best_c(x, y, KFOLD_GRID, 3), x, y)
    xt, yt = features(test[0]), np.array(test[1])
    probe = reference(*_sorted_like_senteval(keys, *train))
    assert ours["accuracy"] == pytest.approx(round(100 * probe.score(xt, yt), 2), abs=0.005 + 1e-9)
    if task == "MRPC":
        assert ours["f1"] == pytest.approx(round(100 * f1_score(yt, probe.predict(xt)), 2), abs=0.005 + 1e-9)
    assert 40 < ours["accuracy"] < 100  # a real, imperfect probe: the comparison is not between two trivial 100s
    # the order matters: on the file's order the folds pick another C, with another test accuracy
    assert reference(*train).score(xt, yt) != probe.score(xt, yt)


def test_best_c_compares_rounded_scores_like_senteval():
    """Two Cs within 0.005 points tie once rounded: SentEval keeps the first; a plain argmax would not."""
    scores = {"mean_test_score": np.array([0.80, 0.812341, 0.812344, 0.79])}
    assert best_c(scores) == 1 and int(np.argmax(scores["mean_test_score"])) == 2
    assert best_c({"mean_test_score": np.array([0.80, 0.8123, 0.8124])}) == 2


# ---- evaluate() and the command line -----------------------------------------------------------
def test_parse_tasks():
    assert parse_tasks("sts") == list(se.STS_TASKS)
    assert parse_tasks("cr, sts12,transfer")[:2] == ["STS12", "MR"]
    with pytest.raises(UsageError, match="unknown task 'STS17'"):
        parse_tasks("STS17")


def test_cli_end_to_end_on_tiny_model(tmp_path, tiny_bert_dir, capsys):
    root = write_senteval(tmp_path / "SentEval")
    out = tmp_path / "out" / "result.json"
    assert cli(["--encoder", str(tiny_bert_dir), "--senteval-dir", str(root), "--tasks", "sts,transfer",
                "--mode", "fasttest", "--json", str(out), "--no-progress", "--device", "cpu", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    header = [c.strip() for c in printed.splitlines()[1].split("|")[1:-1]]
    assert header == ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "Avg."]
    result = json.loads(out.read_text())
    assert set(result["sts"]) == set(se.STS_TASKS) and set(result["transfer"]) == set(se.TRANSFER_TASKS)
    assert result["sts_avg"] == pytest.approx(sum(result["sts"].values()) / 7)
    assert result["sts"]["STS12"] == result["sts_detail"]["STS12"]["all"]
    assert set(result["sts_detail"]["STS12"]["subsets"]) == set(se.STS_YEARS["STS12"])
    assert len(result["sts_detail"]["STS12"]["ci95"]) == 2 and len(result["sts_avg_ci95"]) == 2
    assert "sts_pairs" not in result  # only when evaluate() is asked for them
    import importlib.metadata
    assert result["environment"]["packages"]["torch"] == importlib.metadata.version("torch")
    assert result["environment"]["device"] == "cpu" and result["environment"]["precision"] == "fp32"
    intervals = [c.strip() for c in printed.splitlines()[4].split("|")[1:-1]]  # the line under the scores
    assert intervals[0] == "[{:.2f}, {:.2f}]".format(*result["sts_detail"]["STS12"]["ci95"])
    assert intervals[-1] == "[{:.2f}, {:.2f}]".format(*result["sts_avg_ci95"])
    assert "f1" in result["transfer"]["MRPC"] and result["transfer_avg"] is not None
    assert result["transfer"]["MRPC"]["features"] == "senteval"  # SentEval's features by default
    assert result["transfer_avg_tasks"] == list(se.TRANSFER_TASKS)
    transfer_header = [c.strip() for c in printed.splitlines()[7].split("|")[1:-1]]  # under the STS table and its intervals
    assert transfer_header == [*se.TRANSFER_TASKS, "Avg."] and "Avg. of" not in printed
    assert result["probe"] == "senteval" and all(r["devacc"] is not None for r in result["transfer"].values())
    assert f"CR {result['transfer']['CR']['devacc']:.2f}" in printed  # devacc printed beside acc, as SentEval


def test_transfer_average_says_which_tasks_it_covers(tmp_path, tiny_bert_dir, capsys):
    """Without MR and SUBJ the average is not SentEval's 7-task one: the table's column says how
    many tasks it covers and a line names them; the JSON lists them in transfer_avg_tasks."""
    root = write_senteval(tmp_path / "SentEval")
    for task in ("MR", "SUBJ"):
        for relative in se.BINARY_FILES[task]:
            (root / relative).unlink()
    out = tmp_path / "result.json"
    assert cli(["--encoder", str(tiny_bert_dir), "--senteval-dir", str(root), "--tasks", "transfer", "--mode",
                "fasttest", "--mrpc-features", "full", "--json", str(out), "--no-progress", "--device", "cpu",
                "--probe", "sklearn", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    covered = ["CR", "MPQA", "SST2", "TREC", "MRPC"]
    assert result["transfer_avg_tasks"] == covered and list(result["transfer"]) == covered
    assert result["transfer_avg"] == pytest.approx(sum(result["transfer"][t]["accuracy"] for t in covered) / 5)
    lines = printed.splitlines()
    assert [c.strip() for c in lines[1].split("|")[1:-1]] == [*se.TRANSFER_TASKS, "Avg. of 5"]
    cells = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert cells[:3] == ["-", f"{result['transfer']['CR']['accuracy']:.2f}", "-"]  # MR, CR, SUBJ
    assert "Avg. of 5: CR, MPQA, SST2, TREC, MRPC (not run: MR, SUBJ)" in lines
    assert f"MRPC F1: {result['transfer']['MRPC']['f1']:.2f} (features full: [u, v, |u-v|, u*v])" in lines
    assert format_table(result) == printed.rstrip("\n")
    assert result["probe"] == "sklearn" and result["transfer"]["CR"]["devacc"] is None  # a fixed C: nothing chosen


def test_cli_vocab_for_a_checkpoint_without_tokenizer_files(tmp_path, tiny_bert_dir, vocab_path, capsys):
    root = write_senteval(tmp_path / "SentEval")
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert_dir / name, weights_only)
    argv = ["--encoder", str(weights_only), "--senteval-dir", str(root), "--tasks", "STSBenchmark", "--no-progress",
            "--device", "cpu"]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no tokenizer files" in err and "--vocab FILE" in err
    assert cli(argv + ["--vocab", str(vocab_path)]) == 0
    assert "STSBenchmark" in capsys.readouterr().out


def test_intervals_and_pair_scores(tmp_path, tiny_bert_dir):
    from bertcf import SentenceEncoder
    root = write_senteval(tmp_path / "SentEval")
    result = evaluate(SentenceEncoder.from_pretrained(tiny_bert_dir), root, "sts", pair_scores=True)
    assert set(result["sts_pairs"]) == set(result["sts_detail"]) == set(se.STS_TASKS)
    for task, detail in result["sts_detail"].items():
        lo, hi = detail["ci95"]
        assert lo <= detail["all"] <= hi and lo < hi, task
        assert not {"replicates", "pairs"} & detail.keys()  # taken out by evaluate()
        pairs = result["sts_pairs"][task]
        assert len(pairs["scores"]) == len(pairs["gold"]) == len(pairs["groups"]) == \
            sum(s["n"] for s in detail["subsets"].values())
        assert list(dict.fromkeys(pairs["groups"])) == list(detail["subsets"])  # in the order of "all"
        assert 100 * stats.spearmanr(pairs["scores"], pairs["gold"]).statistic == pytest.approx(detail["all"])
    lo, hi = result["sts_avg_ci95"]
    assert lo <= result["sts_avg"] <= hi
    # Narrower than the sets' own: the average of seven sets' independent resamples varies less.
    assert hi - lo < min(d["ci95"][1] - d["ci95"][0] for d in result["sts_detail"].values())


def test_encodes_each_distinct_sentence_once(tmp_path, tiny_bert_dir):
    from bertcf import SentenceEncoder
    root = write_senteval(tmp_path / "SentEval")
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    calls = []
    encode = encoder.encode
    encoder.encode = lambda sentences, **kw: calls.append(list(sentences)) or encode(sentences, **kw)
    result = evaluate(encoder, root, "sts", mode="dev")
    assert len(calls) == 1 and len(calls[0]) == len(set(calls[0]))
    assert set(result["sts"]) == {"STSBenchmark", "SICKRelatedness"}  # dev mode: STS-B dev, SICK trial


def test_missing_task_skipped_with_warning_and_none_left_is_an_error(tmp_path, tiny_bert_dir, caplog, capsys):
    root = write_senteval(tmp_path / "SentEval")
    (root / se.SICK_FILES["test"]).unlink()
    from bertcf import SentenceEncoder
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    with caplog.at_level(logging.WARNING, logger="bertcf.senteval"):
        result = evaluate(encoder, root, "STSBenchmark,SICKRelatedness")
    assert list(result["sts"]) == ["STSBenchmark"]
    assert any("SICKRelatedness skipped" in r.getMessage() and "SICK_test_annotated.txt" in r.getMessage()
               for r in caplog.records)
    assert cli(["--encoder", str(tiny_bert_dir), "--senteval-dir", str(root), "--tasks", "SICKRelatedness"]) == 2
    assert "error: " in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--tasks", "nope"], "unknown task 'nope'"),
    (["--mode", "dev", "--tasks", "transfer"], "--mode dev scores STS-B dev"),
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, not 0"),
    (["--mrpc-features", "pairs"], "argument --mrpc-features: invalid choice: 'pairs'"),
    (["--senteval-dir", "/nonexistent/x"], "is not a directory"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, tiny_bert_dir, capsys, args, message):
    root = write_senteval(tmp_path / "SentEval")
    try:
        status = cli(["--encoder", str(tiny_bert_dir), "--senteval-dir", str(root), "--no-progress", *args])
    except SystemExit as e:  # argparse's error(): exit status 2 at parsing
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_bad_mrpc_features_refused_before_encoding(tmp_path):
    root = write_senteval(tmp_path / "SentEval")
    with pytest.raises(UsageError, match="--mrpc-features must be one of senteval, full, not 'u,v'"):
        evaluate(None, root, "MRPC", mode="fasttest", mrpc_features="u,v")  # no encoder needed to refuse it


def test_malformed_file_exits_2_and_json_not_written(tmp_path, tiny_bert_dir, capsys):
    root = write_senteval(tmp_path / "SentEval")
    write(root / se.STSB_FILES["test"], ["a\tb\tc\td\t9.5\tx\ty"])
    out = tmp_path / "r.json"
    assert cli(["--encoder", str(tiny_bert_dir), "--senteval-dir", str(root), "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "sts-test.csv line 1: score '9.5' is out of range" in err and len(err.splitlines()) == 1
    assert not out.exists()


# ---- the real files in ../shared/data/senteval ---------------------------------------------------
def _shared(relative: str) -> Path:
    path = SHARED_SENTEVAL / relative
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


def test_real_files_parse_with_senteval_sizes():
    assert [len(se.read_stsb(_shared(se.STSB_FILES[s]))) for s in ("train", "dev", "test")] == [5749, 1500, 1379]
    cr, cr_labels = se.read_binary(_shared(se.BINARY_FILES["CR"][0]), _shared(se.BINARY_FILES["CR"][1]))
    assert (len(cr), sum(cr_labels)) == (3775, 2407)
    mpqa, _ = se.read_binary(_shared(se.BINARY_FILES["MPQA"][0]), _shared(se.BINARY_FILES["MPQA"][1]))
    assert len(mpqa) == 10606
    assert [len(se.read_mrpc(_shared(se.MRPC_FILES[s]))[0]) for s in ("train", "test")] == [4076, 1725]
    assert [len(se.read_sst2(_shared(se.SST2_FILES[s]))[0]) for s in ("train", "dev", "test")] == [67349, 872, 1821]


def test_real_trec_files_six_classes_and_latin1_question():
    train, train_labels = se.read_trec(_shared(se.TREC_FILES["train"]))
    test, test_labels = se.read_trec(_shared(se.TREC_FILES["test"]))
    assert (len(train), len(test)) == (5452, 500)
    # Li and Roth's coarse classes, in SentEval's order ABBR, DESC, ENTY, HUM, LOC, NUM
    assert np.bincount(train_labels).tolist() == [86, 1162, 1250, 1223, 835, 896]
    assert np.bincount(test_labels).tolist() == [9, 138, 94, 65, 81, 113]
    assert [s for s in train if not s.isascii()] == [
        "Which city has the oldest relationship as a sister\u00f0city with Los Angeles ?"]
