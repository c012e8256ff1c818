"""Retrieval in BEIR's layout: the readers and their errors (bertcf.data.beir), the Quora builder,
exact search and its metrics (bertcf.evaluation.retrieval) against values worked out by hand on a
five-document example with ties and against sentence-transformers' InformationRetrievalEvaluator,
and ``python -m bertcf.evaluate --tasks retrieval``."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import write_cs224n_files

from bertcf.data import beir
from bertcf.commands.data import main as data_main
from bertcf.errors import DataError
from bertcf.commands.evaluate import main as cli
from bertcf.evaluation.retrieval import RetrievalEvaluator, model_score, ranking_metrics


def write_set(root: Path, corpus: dict, queries: dict, qrels: list[tuple]) -> Path:
    """A BEIR-layout directory written by hand (not by beir.write, which the builder test covers)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n"
                                               for k, v in corpus.items()))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()))
    (root / "qrels").mkdir(exist_ok=True)
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels))
    return root


# ---- the five-document example ---------------------------------------------------------------
# Dot products of q1 = [1, 0] and q2 = [0, 1] with the documents:
#   q1: d1 .5, d2 .9, d3 .5, d4 .9, d5 .1   -> ranked d2, d4, d1, d3, d5 (ties by id)
#   q2: d1 0,  d2 0,  d3 1,  d4 5,  d5 0    -> ranked d4, d3, d1, d2, d5
VECTORS = {"d1": [0.5, 0.0], "d2": [0.9, 0.0], "d3": [0.5, 1.0], "d4": [0.9, 5.0], "d5": [0.1, 0.0],
           "q1": [1.0, 0.0], "q2": [0.0, 1.0]}


def embed(texts):
    return torch.tensor([VECTORS[t] for t in texts])


def five_documents(qrels1=(("d3", 1), ("d4", 1))):
    corpus = {d: d for d in ("d1", "d2", "d3", "d4", "d5")}  # each document's text is its id
    return beir.RetrievalSet(corpus, {"q1": "q1", "q2": "q2"}, {"q1": dict(qrels1), "q2": {"d2": 1}})


@pytest.mark.parametrize("chunk, block", [(50_000, 256), (2, 1), (3, 2)])
def test_five_documents_with_ties_by_hand(chunk, block):
    """q1's relevant d4 and d3 at ranks 2 and 4; q2's d2 at rank 4, after d1 (tied at 0, lower id)
    and before d5 (tied, higher id). Any other tie rule moves a relevant document."""
    l3, l5 = math.log2(3), math.log2(5)
    expected = {"ndcg@10": ((1 / l3 + 1 / l5) / (1 + 1 / l3) + 1 / l5) / 2, "mrr@10": (1 / 2 + 1 / 4) / 2,
                "recall@100": 1.0, "map@100": ((1 / 2 + 2 / 4) / 2 + 1 / 4) / 2,
                "ndcg@3": (1 / l3) / (1 + 1 / l3) / 2, "mrr@3": 1 / 4, "recall@3": (1 / 2 + 0) / 2,
                "map@3": (1 / 2) / 2 / 2}
    evaluator = RetrievalEvaluator("toy", five_documents(), score="dot", ndcg_at=(10, 3), mrr_at=(10, 3),
                                   recall_at=(100, 3), map_at=(100, 3), corpus_chunk=chunk, query_block=block)
    top = evaluator.search(embed)
    assert top.indices[:, :5].tolist() == [[1, 3, 0, 2, 4], [3, 2, 0, 1, 4]]
    result = evaluator(embed)
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-12), name
    assert (result["queries"], result["corpus"], result["score"]) == (2, 5, "dot")


def test_graded_relevance_and_cosine_by_hand():
    """nDCG's gain is the qrels score (BEIR, trec_eval): q1 with d4 judged 2 and d3 judged 1."""
    result = RetrievalEvaluator("toy", five_documents((("d3", 1), ("d4", 2))), score="dot")(embed)
    q1 = (2 / math.log2(3) + 1 / math.log2(5)) / (2 + 1 / math.log2(3))
    assert result["ndcg@10"] == pytest.approx((q1 + 1 / math.log2(5)) / 2, abs=1e-12)
    # cosine: q2 = [0, 1] against d3 (cos 1/sqrt(1.25)) and d4 (5/sqrt(25.81)): d4 first, then d3
    cos = RetrievalEvaluator("toy", five_documents(), score="cos")
    assert cos.search(embed).indices[1, :2].tolist() == [3, 2]


def test_a_query_never_retrieves_its_own_id():
    """BEIR's ignore_identical_ids: the query "d4" (text q2) does not find d4, its own copy."""
    data = beir.RetrievalSet({d: d for d in VECTORS if d.startswith("d")}, {"d4": "q2"}, {"d4": {"d3": 1}})
    ranked = RetrievalEvaluator("toy", data, score="dot", corpus_chunk=2).search(embed)
    assert ranked.indices[0, :4].tolist() == [2, 0, 1, 4] and ranked.values[0, 4] == -math.inf
    kept = RetrievalEvaluator("toy", data, score="dot", ignore_identical_ids=False).search(embed)
    assert kept.indices[0, :2].tolist() == [3, 2]


def test_map_divides_by_min_of_k_and_relevant():
    """sentence-transformers' MAP@k: with 3 relevant documents and k = 2, the denominator is 2."""
    result = ranking_metrics([["a", "x", "b"]], [{"a": 1, "b": 1, "c": 1}], (2,), (2,), (2,), (2,))
    assert result["map@2"] == pytest.approx(1 / 2)  # precision 1 at rank 1, over min(2, 3)
    assert result["recall@2"] == pytest.approx(1 / 3)


# ---- against sentence-transformers ------------------------------------------------------------
WORDS = "man woman dog cat guitar piano music song film book street beach food water car train".split()


def _random_set(seed: int = 0):
    rng = np.random.default_rng(seed)
    text = lambda: " ".join(rng.choice(WORDS, size=int(rng.integers(2, 7))))  # noqa: E731
    corpus = {f"d{i}": text() for i in range(60)}
    corpus["d7"] = corpus["d42"] = corpus["d5"]  # identical texts: exactly tied scores, broken by id
    queries = {f"q{i}": text() for i in range(14)}
    qrels = {q: {f"d{int(j)}": 1 for j in rng.choice(60, size=int(rng.integers(1, 4)), replace=False)} for q in queries}
    qrels["q0"] = {"d5": 1, "d42": 1}
    return beir.RetrievalSet(corpus, queries, qrels)


@pytest.mark.parametrize("score", ["cos", "dot"])
def test_equal_to_sentence_transformers_evaluator(tiny_bert_dir, tmp_path, score):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.util import dot_score

    from bertcf import SentenceEncoder

    SentenceEncoder.from_pretrained(tiny_bert_dir).save_pretrained(tmp_path / "ckpt")
    encoder = SentenceEncoder.from_pretrained(tmp_path / "ckpt")
    data = _random_set()
    ours = RetrievalEvaluator("toy", data, score=score, corpus_chunk=16, query_block=5)(encoder.encode)
    model = SentenceTransformer(str(tmp_path / "ckpt"), device="cpu")
    functions = {"dot": dot_score} if score == "dot" else None
    theirs = InformationRetrievalEvaluator(data.queries, data.corpus, {q: set(d) for q, d in data.qrels.items()},
                                           corpus_chunk_size=25, mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[10],
                                           precision_recall_at_k=[100], map_at_k=[100], score_functions=functions,
                                           write_csv=False)(model)
    name = "dot" if score == "dot" else "cosine"
    for metric in ("ndcg@10", "mrr@10", "recall@100", "map@100"):
        assert ours[metric] == pytest.approx(theirs[f"{name}_{metric}"], abs=1e-4), metric
    assert 0 < ours["ndcg@10"] < 1  # a real ranking: not a comparison of two perfect (or empty) scores


def test_real_minilm_equal_to_sentence_transformers(real_bert_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from bertcf import SentenceEncoder

    data = _random_set(1)
    ours = RetrievalEvaluator("toy", data, score=model_score(real_bert_dir), corpus_chunk=16)(
        SentenceEncoder.from_pretrained(real_bert_dir).encode)
    theirs = InformationRetrievalEvaluator(data.queries, data.corpus, {q: set(d) for q, d in data.qrels.items()},
                                           precision_recall_at_k=[100], write_csv=False)(
        SentenceTransformer(str(real_bert_dir), device="cpu"))
    for metric in ("ndcg@10", "mrr@10", "recall@100", "map@100"):
        assert ours[metric] == pytest.approx(theirs[f"cosine_{metric}"], abs=1e-4), metric


# ---- the files ----------------------------------------------------------------------------------
def test_reader_roundtrip_and_titles(tmp_path):
    root = write_set(tmp_path / "set", {"a": "alpha", "b": "beta"}, {"q": "query", "r": "unjudged"},
                     [("q", "a", 1), ("q", "b", 0)])
    (root / "corpus.jsonl").write_text('{"_id": "a", "title": "Title", "text": "alpha"}\n\n{"_id": "b", "text": "beta"}\n')
    data = beir.load(root)
    assert data.corpus == {"a": "Title alpha", "b": "beta"}
    assert data.queries == {"q": "query"} and data.qrels == {"q": {"a": 1, "b": 0}}  # "r" has no judgement


@pytest.mark.parametrize("damage, message", [
    (lambda r: (r / "qrels" / "test.tsv").unlink(), "qrels/test.tsv not found"),
    (lambda r: (r / "queries.jsonl").write_text('{"_id": "other", "text": "x"}\n'), "query-id 'q' is not in"),
    (lambda r: (r / "corpus.jsonl").write_text('{"_id": "a", "text": "alpha"}\n{"_id": "b", "text": \n'),
     "corpus.jsonl line 2: not a JSON object"),
    (lambda r: (r / "corpus.jsonl").write_text('{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n'),
     "line 2: _id 'a' appears twice"),
    (lambda r: (r / "corpus.jsonl").write_text('{"id": "a", "text": "x"}\n'), "line 1: expected an object with an \"_id\""),
    (lambda r: (r / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\ta\n"),
     "test.tsv line 2: expected query-id, corpus-id and score"),
    (lambda r: (r / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\ta\thigh\n"),
     "test.tsv line 2: score 'high' is not an integer"),
    (lambda r: (r / "qrels" / "test.tsv").write_text("q\ta\t1\n"), "test.tsv line 1: expected the header"),
    (lambda r: (r / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\ta\t0\n"),
     "no query has a relevant document"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, tiny_bert_dir, capsys, damage, message):
    root = write_set(tmp_path / "set", {"a": "alpha", "b": "beta"}, {"q": "query"}, [("q", "a", 1)])
    damage(root)
    with pytest.raises(DataError, match=message):
        beir.load(root)
    assert cli(["--encoder", str(tiny_bert_dir), "--tasks", "retrieval", "--retrieval-dir", str(root),
                "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message.split("'")[0] in err[0]


def test_relevant_document_missing_from_the_corpus_warns_and_counts_as_missed(tmp_path, caplog):
    root = write_set(tmp_path / "set", {"d1": "d1", "d2": "d2"}, {"q1": "q1"}, [("q1", "d1", 1), ("q1", "gone", 1)])
    data = beir.load(root)
    assert "1 relevant corpus-id(s) not in corpus.jsonl" in caplog.text
    result = RetrievalEvaluator("toy", data, score="dot")(embed)
    assert result["recall@100"] == pytest.approx(0.5)


# ---- the Quora builder --------------------------------------------------------------------------
def test_quora_builder(tmp_path):
    """Queries: the first question of each duplicate pair of dev; relevant: its duplicate; corpus:
    every distinct question of the files present; a query keeps its corpus copy's id."""
    write_cs224n_files(tmp_path / "data")
    from bertcf.data.tasks import read_qqp, task_file
    files = {s: read_qqp(task_file(tmp_path / "data", "qqp", s), labeled=s != "test") for s in ("train", "dev", "test")}
    assert data_main(["beir-quora", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "quora")]) == 0
    built = beir.load(tmp_path / "quora")
    questions = {q.strip() for pairs in files.values() for p in pairs for q in (p.sentence1, p.sentence2)}
    assert set(built.corpus.values()) == questions and len(built.corpus) == len(questions)
    by_text = {text: i for i, text in built.corpus.items()}
    expected = {}
    for p in files["dev"]:
        if p.label == 1.0 and p.sentence1.strip() != p.sentence2.strip():
            expected.setdefault(by_text[p.sentence1.strip()], {})[by_text[p.sentence2.strip()]] = 1
    assert built.qrels == expected and expected
    assert all(built.queries[q] == built.corpus[q] for q in built.queries)


def test_quora_builder_bad_input(tmp_path, capsys):
    assert data_main(["beir-quora", "--data-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "q")]) == 2
    assert "quora-dev.csv not found" in capsys.readouterr().err
    assert data_main(["beir-quora", "--data-dir", str(tmp_path), "--out", str(tmp_path / "q"),
                      "--queries-from", "test"]) == 2
    assert not (tmp_path / "q").exists()


# ---- the command ----------------------------------------------------------------------------------
def test_cli_retrieval_end_to_end(tmp_path, tiny_bert_dir, capsys):
    root = write_set(tmp_path / "set", {f"d{i}": f"the {w} and the {v}" for i, (w, v) in
                                        enumerate(zip(WORDS, WORDS[3:] + WORDS[:3]))},
                     {"q1": "the man", "q2": "a piano"}, [("q1", "d0", 1), ("q2", "d5", 1), ("q2", "d6", 1)])
    out = tmp_path / "r.json"
    result = cli(["--encoder", str(tiny_bert_dir), "--tasks", "retrieval", "--retrieval-dir", str(root),
                  "--retrieval-score", "dot", "--json", str(out), "--no-progress"])
    assert result == 0
    saved = json.loads(out.read_text())["retrieval"]
    assert saved["score"] == "dot" and saved["queries"] == 2 and saved["corpus"] == 16
    assert set(saved) >= {"ndcg@10", "mrr@10", "recall@100", "map@100", "normalized", "dir"}
    assert "nDCG@10" in capsys.readouterr().out
    assert cli(["--encoder", str(tiny_bert_dir), "--tasks", "retrieval", "--no-progress"]) == 2  # no --retrieval-dir
