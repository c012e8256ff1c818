"""``python -m bertcf.search build | query``: the index of a corpus (a text file, a CSV column, a
set in BEIR's layout) encoded a chunk at a time, written beside its vectors and index.json, read
back and queried; its answers are exact search's on the model's own vectors (exact), and the
index's own (every kind); bad input is one line and exit status 2: another model, another width,
a corrupt or missing index, a directory that is no index, faiss missing."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import make_hf_bert_dir

from bertcf import SentenceEncoder
from bertcf.cli import run_main
from bertcf.commands import search
from bertcf.data import beir
from bertcf.search import store
from bertcf.search.index import PRECISION

faiss = pytest.importorskip("faiss", reason="the search indexes need faiss-cpu (pip install 'bertcf[search]')")

SUBJECTS = "a man|the woman|two dogs|a child|the band|a cat".split("|")
ACTIONS = "plays the guitar|rides a horse|eats food|reads a book|walks on the beach|sings a song|runs in the park".split("|")
CORPUS = [f"{s} {a}" for s in SUBJECTS for a in ACTIONS]  # 42 documents
QUERIES = ["a man plays music", "dogs running", "someone reads"]


def run(*argv) -> int:
    return run_main(search.run, [str(a) for a in argv])


@pytest.fixture(scope="module")
def model(tiny_bert_dir, tmp_path_factory):
    """The tiny BERT as a checkpoint that normalises its vectors."""
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    encoder.normalize = True
    path = tmp_path_factory.mktemp("search-model") / "ckpt"
    encoder.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


def build(model, corpus_file, out, *extra) -> int:
    return run("build", "--encoder", model, "--corpus", corpus_file, "--out", out, "--progress", "none",
               "--threads", 1, *extra)


@pytest.mark.parametrize("kind", ["exact", "hnsw", "int8", "binary"])
def test_build_writes_the_index_beside_its_vectors(model, corpus_file, tmp_path, kind, capsys):
    out = tmp_path / "index"
    assert build(model, corpus_file, out, "--index", kind, "--chunk", 10) == 0  # five chunks
    assert f": {kind} index" in capsys.readouterr().out
    meta = json.loads((out / "index.json").read_text())
    assert (meta["kind"], meta["documents"], meta["dim"], meta["score"]) == (kind, len(CORPUS), 32, "cos")
    assert meta["model"]["path"] == str(model.resolve()) and meta["precision"] == PRECISION[kind]
    encoder = SentenceEncoder.from_pretrained(model)
    vectors = np.load(out / "vectors.npy")
    assert np.abs(vectors - encoder.encode(CORPUS, batch_size=64).numpy()).max() < 1e-5
    assert (out / "ranges.npy").is_file() == (kind == "int8")
    ids, texts = store.read_documents(out)
    assert ids == [str(i) for i in range(len(CORPUS))] and texts == CORPUS
    index, _ = store.load(out)
    assert len(index) == len(CORPUS) and meta["index_bytes"] == (out / "index.faiss").stat().st_size
    if kind == "int8":  # ranges of the corpus's unit vectors
        assert np.array_equal(np.load(out / "ranges.npy"), np.vstack([store.unit(vectors).min(0), store.unit(vectors).max(0)]))


@pytest.mark.parametrize("kind", ["exact", "hnsw", "int8", "binary"])
def test_query_answers_as_the_index_and_exact_search_as_the_vectors_do(model, corpus_file, tmp_path, kind, capsys):
    out = tmp_path / "index"
    assert build(model, corpus_file, out, "--index", kind) == 0
    capsys.readouterr()
    assert run("query", "--index", out, "-k", 5, "--threads", 1, *sum((["--query", q] for q in QUERIES), []),
               "--json", tmp_path / "hits.json") == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "hits.json").read_text())
    encoder = SentenceEncoder.from_pretrained(model)
    queries = encoder.encode(QUERIES).numpy()
    index, _ = store.load(out)
    scores, ids = index.search(queries, 5)
    assert [[int(h["id"]) for h in r["hits"]] for r in result["results"]] == ids.tolist()
    assert [[h["text"] for h in r["hits"]] for r in result["results"]] == [[CORPUS[i] for i in row] for row in ids]
    assert np.allclose([[h["score"] for h in r["hits"]] for r in result["results"]], scores, atol=1e-6)
    if kind == "exact":  # the model's cosine, every document scored
        cosines = queries @ encoder.encode(CORPUS).numpy().T
        assert ids.tolist() == np.argsort(-cosines, axis=1, kind="stable")[:, :5].tolist()
    assert printed.count("query: ") == 3 and CORPUS[ids[0, 0]] in printed


def test_query_with_an_onnx_export_of_the_same_model_is_accepted(model, corpus_file, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from bertcf.commands import export

    assert build(model, corpus_file, tmp_path / "index", "--index", "exact") == 0
    assert run_main(export.run, ["onnx", str(model), "--out", str(tmp_path / "onnx")]) == 0
    capsys.readouterr()
    assert run("query", "--index", tmp_path / "index", "--encoder", tmp_path / "onnx", "--query", QUERIES[0],
               "--json", tmp_path / "onnx.json") == 0
    assert run("query", "--index", tmp_path / "index", "--query", QUERIES[0], "--json", tmp_path / "torch.json") == 0
    hits = [[h["id"] for h in json.loads((tmp_path / f"{n}.json").read_text())["results"][0]["hits"]]
            for n in ("onnx", "torch")]
    assert hits[0] == hits[1]
    # an export of a checkpoint that asks for dot products builds a dot-product index, as the checkpoint does
    shutil.copytree(model, tmp_path / "dot")
    (tmp_path / "dot" / "config_sentence_transformers.json").write_text('{"similarity_fn_name": "dot"}')
    assert run_main(export.run, ["onnx", str(tmp_path / "dot"), "--out", str(tmp_path / "dot-onnx")]) == 0
    for encoder in ("dot", "dot-onnx"):
        assert build(tmp_path / encoder, corpus_file, tmp_path / f"index-{encoder}", "--index", "exact") == 0
        assert json.loads((tmp_path / f"index-{encoder}" / "index.json").read_text())["score"] == "dot"


def test_a_beir_corpus_keeps_its_ids_and_a_csv_column_its_rows(model, tmp_path):
    corpus = {f"doc-{i}": text for i, text in enumerate(CORPUS)}
    beir.write(tmp_path / "set", corpus, {"q": QUERIES[0]}, {"q": {"doc-3": 1}})
    assert run("build", "--encoder", model, "--beir", tmp_path / "set", "--out", tmp_path / "a", "--index", "binary",
               "--progress", "none") == 0
    assert store.read_documents(tmp_path / "a") == (list(corpus), CORPUS)
    table = tmp_path / "docs.tsv"
    table.write_text("id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(CORPUS)), encoding="utf-8")
    assert run("build", "--encoder", model, "--corpus", table, "--column", "text", "--out", tmp_path / "b",
               "--progress", "none", "--index", "exact") == 0
    assert store.read_documents(tmp_path / "b")[1] == CORPUS


def test_int8_calibration_sets_the_ranges(model, corpus_file, tmp_path):
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("\n".join(QUERIES + CORPUS[:5]) + "\n", encoding="utf-8")
    assert build(model, corpus_file, tmp_path / "index", "--index", "int8", "--calibration", calibration) == 0
    vectors = store.unit(SentenceEncoder.from_pretrained(model).encode(QUERIES + CORPUS[:5]).numpy())
    assert np.allclose(np.load(tmp_path / "index" / "ranges.npy"), np.vstack([vectors.min(0), vectors.max(0)]),
                       atol=1e-6)
    assert json.loads((tmp_path / "index" / "index.json").read_text())["int8_ranges"] == "calibration sentences"


def one_line(capsys, *needles) -> None:
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err + captured.out, captured.err
    for needle in needles:
        assert needle in captured.err, (needle, captured.err)


def test_another_model_or_width_is_refused_in_one_line(model, corpus_file, tmp_path, vocab_path, capsys):
    assert build(model, corpus_file, tmp_path / "index", "--index", "hnsw") == 0
    other = make_hf_bert_dir(tmp_path / "other", vocab_path, seed=1)
    wider = make_hf_bert_dir(tmp_path / "wider", vocab_path, hidden_size=48)
    capsys.readouterr()
    assert run("query", "--index", tmp_path / "index", "--query", "x", "--encoder", other) == 2
    one_line(capsys, "is not the model the index was built with", str(model))
    assert run("query", "--index", tmp_path / "index", "--query", "x", "--encoder", wider) == 2
    one_line(capsys, "gives vectors of 48 dimensions; the index holds 32")
    small = tmp_path / "small"
    assert build(model, corpus_file, small, "--index", "exact", "--truncate-dim", 16) == 0
    assert json.loads((small / "index.json").read_text())["dim"] == 16
    capsys.readouterr()
    assert run("query", "--index", small, "--query", "x") == 0  # queried at the width it was built at


def test_bad_indexes_and_inputs_are_one_line(model, corpus_file, tmp_path, capsys, monkeypatch):
    good = tmp_path / "index"
    assert build(model, corpus_file, good, "--index", "hnsw") == 0
    capsys.readouterr()
    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    (corrupt / "index.faiss").write_bytes((good / "index.faiss").read_bytes()[:300])
    assert run("query", "--index", corrupt, "--query", "x") == 2
    one_line(capsys, "index.faiss does not match the checksum its index.json records")
    meta = json.loads((good / "index.json").read_text())
    (corrupt / "index.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "checksums"}))
    assert run("query", "--index", corrupt, "--query", "x") == 2  # an index from before the checksums: faiss's check
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 2 and "no checksums" in captured.err, captured.err  # a note, then the error
    assert "is not a readable faiss index" in captured.err.splitlines()[-1] and "Traceback" not in captured.err
    (corrupt / "index.json").write_text("{not json")
    assert run("query", "--index", corrupt, "--query", "x") == 2
    one_line(capsys, "is not a readable JSON file")
    assert run("query", "--index", tmp_path, "--query", "x") == 2
    one_line(capsys, "not a search index")
    edited = tmp_path / "edited"  # index.json without its check vectors; documents.jsonl cut short
    shutil.copytree(good, edited)
    (edited / "index.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "probe"}))
    assert run("query", "--index", edited, "--query", "x") == 2
    one_line(capsys, "is not the description of a BERT-CF search index")
    (edited / "index.json").write_text(json.dumps(meta))
    lines = (good / "documents.jsonl").read_text().splitlines(keepends=True)
    (edited / "documents.jsonl").write_text("".join(lines[:-1]))
    assert run("query", "--index", edited, "--query", "x") == 2
    one_line(capsys, f"holds {len(lines) - 1} documents, index.json says {len(lines)}")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert build(model, corpus_file, mine) == 2
    one_line(capsys, "holds notes.txt, which a build did not write")
    assert (mine / "notes.txt").read_text() == "keep me"
    assert build(model, corpus_file, tmp_path / "x", "--index", "hnsw", "--calibration", corpus_file) == 2
    one_line(capsys, "--calibration sets int8's ranges")
    assert build(model, tmp_path / "missing.txt", tmp_path / "x") == 2
    one_line(capsys, "--corpus", "not found")
    assert not (tmp_path / "x").exists()
    monkeypatch.setitem(sys.modules, "faiss", None)
    assert build(model, corpus_file, tmp_path / "y") == 2
    one_line(capsys, "pip install 'bertcf[search]'")
    assert run("query", "--index", good, "--query", "x") == 2
    one_line(capsys, "pip install 'bertcf[search]'")


def test_a_build_never_replaces_a_users_file_beside_an_index(model, corpus_file, tmp_path, capsys):
    """--out holds an index and a file of the user's: the build is refused (a build replaces the
    directory whole), and both are kept as they were."""
    out = tmp_path / "index"
    assert build(model, corpus_file, out, "--index", "exact") == 0
    (out / "my-notes.txt").write_text("keep me")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert build(model, corpus_file, out, "--index", "hnsw") == 2
    one_line(capsys, f"--out {out} holds my-notes.txt, which a build did not write")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


def test_a_build_into_a_directory_another_build_holds_is_one_line(model, corpus_file, tmp_path, capsys):
    out = tmp_path / "index"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from bertcf.search import directory; "
                               "lock = directory.IndexLock(sys.argv[1]).acquire(); print('held', flush=True); "
                               "sys.stdin.read()", str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert build(model, corpus_file, out) == 2
        one_line(capsys, f"{out} is in use by another process (pid {holder.pid}", "wait for that build to end")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert build(model, corpus_file, out) == 0


def test_bytes_of_the_index_changed_in_place_are_one_line(model, corpus_file, tmp_path, capsys):
    out = tmp_path / "index"
    assert build(model, corpus_file, out, "--index", "exact") == 0
    size = (out / "index.faiss").stat().st_size
    with open(out / "index.faiss", "r+b") as handle:  # the last vector's bytes: faiss reads the file happily
        handle.seek(size - 64)
        handle.write(bytes(64))
    capsys.readouterr()
    assert run("query", "--index", out, "--query", QUERIES[0]) == 2
    one_line(capsys, "index.faiss does not match the checksum its index.json records", "build the index again")


def test_fewer_hits_than_k_are_said_in_one_line(model, corpus_file, tmp_path, capsys):
    out = tmp_path / "index"
    assert build(model, corpus_file, out, "--index", "hnsw") == 0
    capsys.readouterr()
    assert run("query", "--index", out, "--query", QUERIES[0], "--query", QUERIES[1], "-k", 100,
               "--json", tmp_path / "hits.json") == 0
    captured = capsys.readouterr()
    hits = [len(r["hits"]) for r in json.loads((tmp_path / "hits.json").read_text())["results"]]
    assert captured.err.count("\n") == 1 and max(hits) <= len(CORPUS), captured.err
    assert f"fewer than -k 100 documents found for 2 of 2 queries (the fewest {min(hits)})" in captured.err
    assert f"the index holds {len(CORPUS)} documents" in captured.err
    assert run("query", "--index", out, "--query", QUERIES[0], "-k", 5) == 0
    assert capsys.readouterr().err == ""
