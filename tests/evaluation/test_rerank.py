"""Reranking a retrieval's lists with a cross-encoder (``python -m bertcf.evaluate --tasks retrieval
--rerank CROSS_ENCODER --rerank-top K``): each query's top K put in the order of the cross-encoder's
scores, against a rerank by hand; the documents after K keep the search's order; the metrics and
the times in the JSON; bad input in one line."""
from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import offline_hub_cache

from bertcf.commands.evaluate import main as cli
from bertcf.data import beir
from bertcf.evaluation.retrieval import RetrievalEvaluator, ranking_metrics
from bertcf.models.cross_encoder import CrossEncoder
from bertcf.models.encoder import SentenceEncoder

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = ["how do i learn english", "what is the best way to learn english", "how can i cook rice",
             "what is the easiest way to cook rice", "how do i train a dog", "how can i make money online",
             "what is the best way to make money online", "how do i find a good school", "who is the president",
             "how do i read more books", "where is the market", "why do dogs run on the beach"]


def question_set() -> beir.RetrievalSet:
    corpus = {f"d{i:02d}": q for i, q in enumerate(QUESTIONS)}
    queries = {"d00": QUESTIONS[0], "d02": QUESTIONS[2], "d05": QUESTIONS[5], "q9": "a good school near the market"}
    qrels = {"d00": {"d01": 1}, "d02": {"d03": 1}, "d05": {"d06": 1}, "q9": {"d07": 1, "d10": 1}}
    return beir.RetrievalSet(corpus, queries, qrels)


@pytest.fixture(scope="module")
def models(tiny_bert_dir, tmp_path_factory):
    torch.manual_seed(1)
    cross = CrossEncoder.from_pretrained(tiny_bert_dir, num_labels=1)
    with torch.no_grad():
        cross.classifier.weight.normal_(0, 3.0)  # scores far apart: an order unlike the bi-encoder's
    directory = tmp_path_factory.mktemp("reranker") / "ce"
    cross.save_pretrained(directory)
    return SentenceEncoder.from_pretrained(tiny_bert_dir), cross, directory


def test_rerank_is_the_cross_encoders_order(models):
    encoder, cross, _ = models
    data = question_set()
    evaluator = RetrievalEvaluator("toy", data, ndcg_at=(3, 10), mrr_at=(3, 10), recall_at=(10,), map_at=(10,))
    encode = lambda texts: encoder.encode(texts)  # noqa: E731
    depth = 5
    positions = [[i for i in row if i >= 0] for row in evaluator.search(encode, depth=10).indices.tolist()]
    searched = [[evaluator.corpus_ids[i] for i in row] for row in positions]
    # by hand: each query's first five, sorted by the cross-encoder's logit (sentence-transformers' rank order)
    by_hand = []
    for q, docs in zip(evaluator.query_ids, searched):
        logits = cross.predict([(data.queries[q], data.corpus[d]) for d in docs[:depth]], raw_logits=True).tolist()
        order = sorted(range(depth), key=lambda j: -logits[j])
        by_hand.append([docs[:depth][j] for j in order] + docs[depth:])
    reranked = evaluator.rerank(positions, lambda pairs: cross.predict(pairs, raw_logits=True), depth)
    assert reranked == by_hand
    assert reranked != searched  # the cross-encoder changed some order, so the comparison means something
    assert all(sorted(a[:depth]) == sorted(b[:depth]) and a[depth:] == b[depth:] for a, b in zip(reranked, searched))
    # the call: reranked metrics from these lists, the search's beside them, and the times
    result = evaluator(encode, rerank=lambda pairs: cross.predict(pairs, raw_logits=True), rerank_top=depth)
    expected = ranking_metrics(by_hand, evaluator.qrels, **evaluator.cutoffs)
    assert {k: result[k] for k in expected} == pytest.approx(expected, abs=1e-12)
    first = ranking_metrics(searched, evaluator.qrels, **evaluator.cutoffs)
    assert {k: result["first_stage"][k] for k in first} == pytest.approx(first, abs=1e-12)
    assert result["rerank_top"] == depth and result["rerank_seconds"] > 0
    assert result["queries_per_second"] == pytest.approx(4 / (result["search_seconds"] + result["rerank_seconds"]))


def test_reranking_shows_the_pairs_scored_and_the_time_left(models, monkeypatch, capsys):
    """Issue 59: `--rerank-top 100` printed nothing for 200 s (a bar moved once a block of 256 queries,
    25,600 pairs). The pairs are scored about RERANK_PAIRS at a time, whole queries, with a line (in a
    log) at each tenth of them; the order is the same as in one block."""
    from bertcf.evaluation import retrieval
    from bertcf.utils import progress

    encoder, cross, _ = models
    evaluator = RetrievalEvaluator("toy", question_set(), ndcg_at=(3,), mrr_at=(3,), recall_at=(10,), map_at=(10,))
    positions = [[i for i in row if i >= 0] for row in
                 evaluator.search(lambda texts: encoder.encode(texts), depth=10).indices.tolist()]
    score = lambda pairs: cross.predict(pairs, raw_logits=True)  # noqa: E731
    whole = evaluator.rerank(positions, score, 5)
    monkeypatch.setattr(retrieval, "RERANK_PAIRS", 6)  # a query (5 pairs) a block
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    capsys.readouterr()
    assert evaluator.rerank(positions, score, 5, show_progress_bar="lines") == whole
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == [f"toy: rerank: {n}/20 pairs" for n in (5, 10, 15, 20)]
    assert "left" in lines[0] and "left" not in lines[-1]


def test_the_command_reranks_and_reports(models, tmp_path, capsys):
    encoder_dir = tmp_path / "encoder"
    models[0].save_pretrained(encoder_dir)
    data = question_set()
    beir.write(tmp_path / "set", data.corpus, data.queries, data.qrels)
    out = tmp_path / "result.json"
    status = cli(["--encoder", str(encoder_dir), "--tasks", "retrieval", "--retrieval-dir", str(tmp_path / "set"),
                  "--rerank", str(models[2]), "--rerank-top", "4", "--device", "cpu", "--json", str(out)])
    assert status == 0
    table = capsys.readouterr().out
    assert "+ rerank@4" in table and "queries/s" in table
    result = json.loads(out.read_text())["retrieval"]
    assert result["rerank"] == str(models[2]) and result["rerank_top"] == 4
    assert set(result["first_stage"]) >= {"ndcg@10", "mrr@10", "recall@100", "map@100", "queries_per_second"}
    assert all(math.isfinite(result[k]) for k in ("ndcg@10", "mrr@10", "index_seconds", "search_seconds",
                                                  "rerank_seconds", "queries_per_second"))


def test_a_hub_name_reranks_from_the_cache(models, tmp_path, monkeypatch, capsys):
    encoder_dir = tmp_path / "encoder"
    models[0].save_pretrained(encoder_dir)
    data = question_set()
    beir.write(tmp_path / "set", data.corpus, data.queries, data.qrels)
    offline_hub_cache(monkeypatch, tmp_path, "bertcf-test/reranker", models[2])
    assert cli(["--encoder", str(encoder_dir), "--tasks", "retrieval", "--retrieval-dir", str(tmp_path / "set"),
                "--rerank", "bertcf-test/reranker", "--device", "cpu"]) == 0
    assert "+ rerank@100" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["not_retrieval", "unknown_name", "no_cross_encoder", "three_classes"])
def test_bad_rerank_is_one_line(case, models, tmp_path, monkeypatch, capsys, tiny_bert_dir):
    encoder_dir = tmp_path / "encoder"
    models[0].save_pretrained(encoder_dir)
    data = question_set()
    beir.write(tmp_path / "set", data.corpus, data.queries, data.qrels)
    offline_hub_cache(monkeypatch, tmp_path, "bertcf-test/other", models[2])
    CrossEncoder.from_pretrained(tiny_bert_dir, num_labels=3).save_pretrained(tmp_path / "nli")
    retrieval = ["--tasks", "retrieval", "--retrieval-dir", str(tmp_path / "set")]
    args, message = {"not_retrieval": (["--tasks", "sts", "--rerank", str(models[2])], "retrieval"),
                     "unknown_name": (retrieval + ["--rerank", "cross-encoder/ms-marco-MiniLM-L-6-v2"], "offline"),
                     "no_cross_encoder": (retrieval + ["--rerank", str(tiny_bert_dir)], "is not a cross-encoder"),
                     "three_classes": (retrieval + ["--rerank", str(tmp_path / "nli")], "of 3 classes")}[case]
    assert cli(["--encoder", str(encoder_dir), "--device", "cpu", *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, err
    assert message in err[0]
    assert captured.out == ""  # stopped before anything was encoded or scored
