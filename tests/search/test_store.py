"""A search index on disk (bertcf.search.store) under faults: a build replaces only a directory
that holds an index and nothing else, one build at a time holds it (another is refused in one
line) in a temporary directory of its own, a build killed between its two renames is recovered
(the previous index comes back), and bytes of an index file changed in place are found by the
checksums index.json records; an index written before them still loads. The model is a stand-in
(each text's vector drawn from its hash), so no encoder loads here."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bertcf.errors import DataError, UsageError
from bertcf.search import store

faiss = pytest.importorskip("faiss", reason="the search indexes need faiss-cpu (pip install 'bertcf[search]')")

DIM = 24
TEXTS = [f"document number {i}" for i in range(60)]
MODEL = {"name": "stand-in", "path": None, "backend": "numpy", "max_length": None, "truncate_dim": None}


def encode(texts):
    """A vector for each text, the same every time (seeded by the text's hash)."""
    return np.stack([np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=DIM)
                     for t in texts]).astype(np.float32)


def build(directory, texts=TEXTS, kind="exact", encoder=encode):
    return store.build(directory, encoder, [str(i) for i in range(len(texts))], texts, kind, "cos", MODEL)


def nearest(directory, text: str) -> str:
    index, meta = store.load(directory)
    _, ids = index.search(store.unit(encode([text])), 1)
    return store.read_documents(directory, meta["documents"], meta)[1][ids[0, 0]]


def test_a_build_replaces_an_index_and_refuses_a_directory_that_holds_anything_else(tmp_path):
    out = tmp_path / "index"
    build(out)
    build(out, TEXTS[:30], kind="int8")  # an index is replaced whole (its ranges.npy included)...
    build(out, TEXTS[:20])  # ...and ranges.npy, which the int8 build wrote, goes with it
    assert sorted(p.name for p in out.iterdir()) == ["documents.jsonl", "index.faiss", "index.json", "vectors.npy"]
    (out / "notes.txt").write_text("keep me")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UsageError, match=r"holds notes\.txt, which a build did not write"):
        build(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing lost, the index untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # no lock or temporary directory left
    (out / "notes.txt").unlink()
    (out / "extra").mkdir()
    with pytest.raises(UsageError, match="holds extra, which a build did not write"):
        build(out)


def test_each_build_writes_in_a_temporary_directory_of_its_own(tmp_path):
    out, seen = tmp_path / "index", []

    def watching(texts):
        seen.append(sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".index.build-")))
        return encode(texts)
    build(out, encoder=watching)
    build(out, encoder=watching)
    first, second = seen[0], seen[-1]
    assert len(first) == len(second) == 1 and first != second  # each its own, removed once swapped in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


HOLDER = textwrap.dedent("""
    import sys
    import numpy as np
    from bertcf.search import store

    def encode(texts):  # a build that takes its time: until the test closes our stdin
        print("building", flush=True)
        sys.stdin.read()
        return np.ones((len(texts), 24), dtype=np.float32)
    store.build(sys.argv[1], encode, ["0"], ["the other build's document"], "exact", "cos", {"name": "other"})
""")


@pytest.mark.slow  # starts a process that holds the index
def test_a_second_build_into_the_same_directory_at_once_is_refused_in_one_line(tmp_path):
    """Another process's build is writing --out: this one is refused at once, naming it, and takes
    nothing from it; that build then finishes as if alone."""
    out = tmp_path / "index"
    build(out)
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "building"
        with pytest.raises(UsageError) as refused:
            build(out, TEXTS[:10])
        assert "\n" not in str(refused.value)
        assert f"{out} is in use by another process (pid {other.pid}" in str(refused.value)
    finally:
        other.stdin.close()
        other.wait(timeout=120)
    assert other.returncode == 0, other.stderr.read()
    assert store.read_documents(out)[1] == ["the other build's document"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    build(out, TEXTS[:10])  # once it has ended
    assert store.load(out)[1]["documents"] == 10


def interrupted_swap(tmp_path):
    """The state a build killed between its two renames leaves: the previous index moved aside as
    .index.old, the new one complete in its temporary directory, no index/."""
    out = tmp_path / "index"
    build(out, TEXTS[:40])
    build(tmp_path / "new", TEXTS[40:])
    os.replace(out, tmp_path / ".index.old")
    os.replace(tmp_path / "new", tmp_path / ".index.build-123-abcd")
    return out


def test_a_query_after_an_interrupted_replacement_gets_the_previous_index_back(tmp_path, capsys):
    out = interrupted_swap(tmp_path)
    assert nearest(out, TEXTS[3]) == TEXTS[3]  # the previous index, whole
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "previous index is back" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".index.build-123-abcd", "index"]
    nearest(out, TEXTS[3])
    assert capsys.readouterr().err == ""  # said once


def test_a_build_after_an_interrupted_replacement_recovers_first(tmp_path, capsys):
    out = interrupted_swap(tmp_path)
    build(out, TEXTS[:5])
    assert "previous index is back" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # what the killed build left is gone
    assert store.load(out)[1]["documents"] == 5


def test_a_killed_build_leaves_the_previous_index(tmp_path):
    out = tmp_path / "index"
    build(out, TEXTS[:40])

    def dying(texts):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        build(out, encoder=dying)
    assert store.load(out)[1]["documents"] == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


def overwrite(path, offset: int, data: bytes) -> None:
    """Bytes of ``path`` overwritten in place: the same size, the same name."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


@pytest.mark.parametrize("kind", ["exact", "hnsw", "int8", "binary"])
def test_bytes_changed_in_place_are_refused_by_the_checksums(tmp_path, kind):
    out = tmp_path / "index"
    build(out, kind=kind)
    meta = json.loads((out / "index.json").read_text())
    expected = {f: meta["checksums"]["files"][f] for f in meta["checksums"]["files"]}
    assert meta["checksums"]["algorithm"] == "sha256"
    assert expected == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()
                        if p.name != "index.json"}
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine)
    size = (out / "index.faiss").stat().st_size
    overwrite(out / "index.faiss", size - 40, bytes(16))  # vectors' or codes' bytes: faiss reads it happily
    with pytest.raises(DataError, match=r"index\.faiss does not match the checksum its index\.json records"):
        store.load(out)
    shutil.copyfile(pristine / "index.faiss", out / "index.faiss")
    text = (out / "documents.jsonl").read_bytes()
    overwrite(out / "documents.jsonl", text.index(b"number 7"), b"number 8")  # still valid JSON, one row off
    with pytest.raises(DataError, match=r"documents\.jsonl does not match the checksum its index\.json records"):
        store.read_documents(out, meta["documents"], meta)
    if kind == "int8":
        shutil.copyfile(pristine / "documents.jsonl", out / "documents.jsonl")
        ranges = np.load(out / "ranges.npy")
        np.save(out / "ranges.npy", ranges[::-1].copy())  # the same shape and size
        with pytest.raises(DataError, match=r"ranges\.npy does not match"):
            store.load(out)


def test_an_index_without_checksums_still_loads_with_one_note(tmp_path, capsys):
    out = tmp_path / "index"
    build(out)
    meta = json.loads((out / "index.json").read_text())
    del meta["checksums"]
    (out / "index.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert nearest(out, TEXTS[5]) == TEXTS[5]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checksums" in err, err
