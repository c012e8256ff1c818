"""mteb on local files (bertcf.evaluation.mteb_tasks, ``python -m bertcf.evaluate --tasks
mteb-sts,mteb-retrieval``): mteb's own STS and retrieval evaluators, given a BERT-CF encoder through
the adapter and the data through the local task classes, give the figures bertcf's evaluation gives
on the same files (STS-B's Spearman, retrieval's nDCG@10, MRR@10, Recall@100), from a checkpoint
and from its ONNX export; sentence-transformers' model run by mteb's own wrapper gives the
adapter's STS figure; without mteb the command says in one line what to install.

mteb rounds the retrieval metrics it takes from pytrec_eval to 5 decimals (MRR it computes itself),
hence the tolerance there."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import SHARED, assert_one_error_line, cs224n_sentence, senteval_sentence, write_lines

from bertcf import SentenceEncoder
from bertcf.cli import run_main
from bertcf.commands import evaluate as evaluate_cli
from bertcf.commands import export as export_cli
from bertcf.data import beir
from bertcf.data import senteval as se

MTEB_REASON = "mteb is an optional extra: pip install 'bertcf[mteb]'"
PYTREC_ROUNDING = 6e-6  # mteb keeps 5 decimals of pytrec_eval's nDCG and recall


@pytest.fixture(scope="module")
def mteb_tasks():
    pytest.importorskip("mteb", reason=MTEB_REASON)
    from bertcf.evaluation import mteb_tasks
    return mteb_tasks


def write_stsb(root: Path, n: int = 30) -> Path:
    """STS-B test and dev in SentEval's layout: n pairs each, distinct sentences, gold scores with no ties."""
    for split, shift in (("test", 0), ("dev", 7)):
        write_lines(root / se.STSB_FILES[split], [
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{(i * 37 % n) * 5 / n:.3f}\t{senteval_sentence(i + shift)} {i}"
            f"\t{cs224n_sentence(2 * i + shift)}" for i in range(n)])
    return root


def write_retrieval_set(root: Path) -> Path:
    """40 distinct documents, 12 queries with graded and zero judgements, a relevant document absent
    from the corpus, and a query with its own id in the corpus (never retrieved for it)."""
    corpus = {f"d{i}": f"{cs224n_sentence(i)} {i}" for i in range(40)}
    queries = {f"q{i}": cs224n_sentence(3 * i + 7) for i in range(12)} | {"d3": corpus["d3"]}
    qrels = {f"q{i}": {f"d{5 * i % 40}": 1 + i % 2, f"d{(5 * i + 3) % 40}": 1, f"d{(i + 1) % 40}": 0}
             for i in range(12)}
    qrels["q1"]["absent"] = 1
    qrels["d3"] = {"d4": 1}
    beir.write(root, corpus, queries, qrels)
    return root


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mteb-data")
    return {"senteval": write_stsb(root / "senteval"), "beir": write_retrieval_set(root / "beir")}


@pytest.fixture(scope="module")
def checkpoint(tiny_bert_dir, tmp_path_factory) -> Path:
    """The tiny BERT as a SentenceEncoder checkpoint, exported to ONNX in place (CHECKPOINT/onnx)."""
    path = tmp_path_factory.mktemp("mteb-ckpt") / "ckpt"
    SentenceEncoder.from_pretrained(tiny_bert_dir).save_pretrained(path)
    export_cli.run(["onnx", str(path)])
    return path


def evaluate(tmp_path, *argv) -> dict:
    """``python -m bertcf.evaluate ARGV --json FILE``'s results, as written to the file."""
    out = tmp_path / f"result-{len(list(tmp_path.glob('result-*')))}.json"
    assert run_main(evaluate_cli.run, [*map(str, argv), "--json", str(out), "--no-progress"]) == 0
    return json.loads(out.read_text())


# ---- the figures equal bertcf's ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["test", "dev"])
def test_mteb_sts_equals_bertcf_stsb(mteb_tasks, checkpoint, files, tmp_path, mode):
    """mteb's cosine Spearman on STS-B test (dev in --mode dev) = bertcf's STSBenchmark, ×100."""
    result = evaluate(tmp_path, "--encoder", checkpoint, "--senteval-dir", files["senteval"], "--mode", mode,
                      "--tasks", "STSBenchmark,mteb-sts")
    mteb = result["mteb"]["STSBenchmarkLocal"]
    assert (mteb["split"], mteb["main_score"]) == (mode, "cosine_spearman")
    assert abs(result["sts"]["STSBenchmark"]) > 1  # a figure that reorders pairs would show
    assert 100 * mteb["value"] == pytest.approx(result["sts"]["STSBenchmark"], abs=1e-6)


@pytest.mark.parametrize("score", ["cos", "dot"])
def test_mteb_retrieval_equals_bertcf_retrieval(mteb_tasks, checkpoint, files, tmp_path, score):
    result = evaluate(tmp_path, "--encoder", checkpoint, "--tasks", "retrieval,mteb-retrieval", "--retrieval-dir",
                      files["beir"], "--retrieval-score", score)
    ours, mteb = result["retrieval"], result["mteb"]["BEIRLocal"]
    assert (mteb["main_score"], mteb["set"]) == ("ndcg_at_10", str(files["beir"]))
    assert 0 < ours["ndcg@10"] < 1 and ours["queries"] == 13
    assert mteb["value"] == pytest.approx(ours["ndcg@10"], abs=PYTREC_ROUNDING)
    assert mteb["scores"]["recall_at_100"] == pytest.approx(ours["recall@100"], abs=PYTREC_ROUNDING)
    assert mteb["scores"]["mrr_at_10"] == pytest.approx(ours["mrr@10"], abs=1e-9)


def test_the_onnx_export_through_mteb_equals_the_checkpoint(mteb_tasks, checkpoint, files, tmp_path):
    """The export under ONNX Runtime, scored by mteb, against bertcf's figures of the checkpoint."""
    torch_run = evaluate(tmp_path, "--encoder", checkpoint, "--senteval-dir", files["senteval"], "--tasks",
                         "STSBenchmark,retrieval", "--retrieval-dir", files["beir"])
    onnx_run = evaluate(tmp_path, "--encoder", checkpoint / "onnx", "--senteval-dir", files["senteval"], "--tasks",
                        "mteb-sts,mteb-retrieval", "--retrieval-dir", files["beir"])
    assert onnx_run["environment"]["device"].startswith("onnxruntime:")
    assert 100 * onnx_run["mteb"]["STSBenchmarkLocal"]["value"] == pytest.approx(torch_run["sts"]["STSBenchmark"],
                                                                             abs=1e-6)
    assert onnx_run["mteb"]["BEIRLocal"]["value"] == pytest.approx(torch_run["retrieval"]["ndcg@10"],
                                                                   abs=PYTREC_ROUNDING)


def test_truncate_dim_reaches_the_adapter(mteb_tasks, checkpoint, files, tmp_path):
    result = evaluate(tmp_path, "--encoder", checkpoint, "--senteval-dir", files["senteval"], "--tasks",
                      "STSBenchmark,mteb-sts", "--truncate-dim", "8")
    full = evaluate(tmp_path, "--encoder", checkpoint, "--senteval-dir", files["senteval"], "--tasks", "STSBenchmark")
    assert result["sts"]["STSBenchmark"] != pytest.approx(full["sts"]["STSBenchmark"], abs=1e-3)
    mteb = result["mteb"]["STSBenchmarkLocal"]
    assert 100 * mteb["value"] == pytest.approx(result["sts"]["STSBenchmark"], abs=1e-6)


def test_sentence_transformers_in_mteb_equals_the_adapter(mteb_tasks, tiny_bert_dir, files):
    """mteb's own sentence-transformers wrapper on the same directory (mean pooling) gives the adapter's figure."""
    import mteb
    from sentence_transformers import SentenceTransformer

    task = mteb_tasks.LocalSTSB(files["senteval"])
    ours = mteb_tasks.evaluate_mteb(mteb_tasks.MtebModel(SentenceEncoder.from_pretrained(tiny_bert_dir)), [task])
    theirs = mteb.evaluate(SentenceTransformer(str(tiny_bert_dir), device="cpu"), [task], cache=None,
                           co2_tracker=False, show_progress_bar=False)
    value = theirs.task_results[0].scores["test"][0]["cosine_spearman"]
    assert ours["STSBenchmarkLocal"]["value"] == pytest.approx(value, abs=1e-6)


# ---- the real checkpoint --------------------------------------------------------------------------------------
def test_real_minilm_stsb_test(mteb_tasks, real_bert_dir, tmp_path, capsys):
    """STS-B test of the shared SentEval files: mteb through the adapter = bertcf.evaluate (the
    command the lead's measurement runs; sentence-transformers' own model in mteb is the tiny test's)."""
    senteval = SHARED / "data" / "senteval"
    if not (senteval / se.STSB_FILES["test"]).is_file():
        pytest.skip(f"{senteval / se.STSB_FILES['test']} not present")
    result = evaluate(tmp_path, "--encoder", real_bert_dir, "--senteval-dir", senteval, "--tasks",
                      "STSBenchmark,mteb-sts")
    value = 100 * result["mteb"]["STSBenchmarkLocal"]["value"]
    with capsys.disabled():
        print(f"\n[{real_bert_dir}] STS-B test: bertcf.evaluate {result['sts']['STSBenchmark']:.4f}, "
              f"mteb through the adapter {value:.4f}")
    assert value == pytest.approx(result["sts"]["STSBenchmark"], abs=1e-3)


# ---- bad input ------------------------------------------------------------------------------------------------
def test_without_mteb_one_line_says_what_to_install(monkeypatch, files, tmp_path, capsys):
    """Before anything loads: the encoder named does not even exist."""
    monkeypatch.setitem(sys.modules, "mteb", None)  # importlib finds no mteb, as where it is not installed
    argv = ["--encoder", str(tmp_path / "no-model"), "--senteval-dir", str(files["senteval"]), "--tasks", "mteb-sts"]
    assert run_main(evaluate_cli.run, argv) == 2
    assert_one_error_line(capsys, "mteb-sts needs mteb", "pip install 'bertcf[mteb]'")


@pytest.mark.parametrize("case, message", [
    ("no retrieval dir", "--tasks mteb-retrieval needs --retrieval-dir"),
    ("no STS-B file", "sts-test.csv"),
    ("onnx with sentEval tasks", "is an ONNX export"),
    ("onnx with pooling", "fixed in an ONNX export"),
])
def test_bad_input_is_one_line_and_exit_2(mteb_tasks, checkpoint, files, tmp_path, capsys, case, message):
    empty = tmp_path / "senteval"
    empty.mkdir()
    argv = {"no retrieval dir": ["--encoder", checkpoint, "--tasks", "mteb-retrieval"],
            "no STS-B file": ["--encoder", tmp_path / "no-model", "--senteval-dir", empty, "--tasks", "mteb-sts"],
            "onnx with sentEval tasks": ["--encoder", checkpoint / "onnx", "--senteval-dir", files["senteval"],
                                         "--tasks", "STSBenchmark,mteb-sts"],
            "onnx with pooling": ["--encoder", checkpoint / "onnx", "--senteval-dir", files["senteval"],
                                  "--tasks", "mteb-sts", "--pooling", "cls"]}[case]
    assert run_main(evaluate_cli.run, [str(a) for a in argv]) == 2
    assert_one_error_line(capsys, message)


def test_the_extra_is_declared_and_installed_by_ci():
    """``pip install 'bertcf[mteb]'`` (the error's advice) names mteb; CI installs the extra."""
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [r for r in extras["mteb"] if r.startswith("mteb")]
    install = next(line for line in (repo / ".ci" / "run").read_text().splitlines() if "pip install -e" in line)
    assert "mteb" in install.split('".[')[1].split(']"')[0].split(",")
