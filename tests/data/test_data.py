"""Tests for bertcf.data: task readers, corpus reader, task corpus and downloader."""

from __future__ import annotations

import hashlib
import logging
import shutil
import socket
from pathlib import Path

import pytest

from bertcf.data import download
from bertcf.data import tasks as data
from bertcf.commands.data import main as data_main
from bertcf.data.download import Source
from bertcf.data.tasks import PairExample, SentenceExample
from bertcf.errors import DataError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "cs224n"
OFFLINE = SHARED.parent / "cs224n-offline"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")


def write(path: Path, rows: list[list[str]] | str) -> Path:
    """Write a tab-separated file (a list of rows) or raw text."""
    text = rows if isinstance(rows, str) else "".join("\t".join(r) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return path


def data_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "bertcf.data" and r.levelno == logging.WARNING]


SST_HEADER = ["", "id", "sentence", "sentiment"]
QQP_HEADER = ["", "id", "sentence1", "sentence2", "is_duplicate"]
STS_HEADER = ["", "id", "sentence1", "sentence2", "similarity"]


# ----------------------------------------------------------------------------- real files

@needs_shared
class TestRealFiles:
    def test_sst(self):
        train = data.read_sst(SHARED / "ids-sst-train.csv")
        dev = data.read_sst(SHARED / "ids-sst-dev.csv")
        assert (len(train), len(dev)) == (8544, 1101)
        assert train[0] == SentenceExample(
            "32a4f146782cbde1b7fa65799",
            "The Rock is destined to be the 21st Century 's new `` Conan '' and that he 's going "
            "to make a splash even greater than Arnold Schwarzenegger , Jean-Claud Van Damme or "
            "Steven Segal .", 3)
        assert dev[0] == SentenceExample(
            "a7d575c9ed86ea9633660c67e",
            "It 's a lovely film with lovely performances by Buy and Accorsi .", 3)
        assert train[-1] == SentenceExample("69121a33e2470c0b0b28cceee", "In this case zero .", 1)
        assert {ex.label for ex in train} == {0, 1, 2, 3, 4}
        assert all(isinstance(ex.label, int) for ex in train + dev)

    def test_sst_test_has_shifted_header(self):
        test = data.read_sst(SHARED / "ids-sst-test-student.csv")
        assert len(test) == 2210
        assert test[0] == SentenceExample("b7573736a6ddf7be102b7fee0",
                                          "Effective but too-tepid biopic", None)
        assert test[-1] == SentenceExample("95d5aedb8dbdfdcb4705f5e14",
                                           "-LRB- U -RRB- nrelentingly stupid .", None)
        with pytest.raises(DataError, match="missing label column 'sentiment'"):
            data.read_sst(SHARED / "ids-sst-test-student.csv", labeled=True)

    def test_quora_dev_skips_two_empty_labels(self, caplog):
        dev = data.read_qqp(SHARED / "quora-dev.csv")
        assert len(dev) == 20212
        (message,) = data_warnings(caplog)
        assert "skipped 2 of 20214 rows" in message and "lines 2577, 14222" in message
        assert dev[0] == PairExample(
            "fbfddc56315fb8a39e7608fa0", "What can you get as a customer of Star Alliance?",
            "What are some ways to register with Star Alliance?", 0.0)
        # CSV quoting with doubled quotes is undone exactly once.
        assert dev[1].id == "318658e273ac78f3b1e957b8b"
        assert dev[1].sentence1 == ('"Which is correct grammar: I graduated from University of '
                                    'XXXX or I graduated from the University of XXXX? Do I need '
                                    '""the"" here?"')
        assert dev[-1].id == "43fb8a68c4664400b42db7f83" and dev[-1].label == 0.0
        labels = [ex.label for ex in dev]
        assert (labels.count(0.0), labels.count(1.0)) == (12627, 7585)

    def test_quora_dev_unlabeled_skips_blank_question(self):
        # Row 264614 also has an empty sentence2; row 65479 is usable without its label.
        assert len(data.read_qqp(SHARED / "quora-dev.csv", labeled=False)) == 20213

    def test_sts(self):
        train = data.read_sts(SHARED / "sts-train.csv")
        dev = data.read_sts(SHARED / "sts-dev.csv")
        test = data.read_sts(SHARED / "sts-test-student.csv")
        assert (len(train), len(dev), len(test)) == (6040, 863, 1725)
        assert train[0] == PairExample("6d0ec4e8a34ac432e1c1699a0",
                                       "13 killed in Afgan terror attack",
                                       "6 killed in Afghan capital mosque attack", 2.0)
        assert dev[1] == PairExample("e8336dc096adaf2de4e8e9425",
                                     "Two black dogs are playing on the grass.",
                                     "Two black dogs are playing in a grassy plain.", 4.6)
        assert test[0] == PairExample("cce9b526b3590d2ca2178584f",
                                      "A band is performing on a stage.",
                                      "A band is playing and singing on a stage.", None)
        labels = [ex.label for ex in train + dev]
        assert min(labels) == 0.0 and max(labels) == 5.0

    def test_read_task_and_missing_quora_train(self):
        assert len(data.read_task(SHARED, "sts", "dev")) == 863
        with pytest.raises(DataError, match=r"quora-train\.csv not found"):
            data.read_task(SHARED, "qqp", "train")

    def test_shared_files_match_downloader_checksums(self):
        for source in download.SOURCES["cs224n"]:
            if (SHARED / source.name).exists():
                assert download.verify_file(SHARED / source.name, source) is None, source.name

    @pytest.mark.skipif(not OFFLINE.is_dir(), reason=f"{OFFLINE} not present")
    def test_task_sentences_offline_dir(self):
        sentences = data.task_sentences(OFFLINE)
        assert len(sentences) == len(set(sentences)) > 40000
        assert sentences[0].startswith("The Rock is destined")
        assert all(s == s.strip() and s for s in sentences)


# ----------------------------------------------------------------------------- file names

def test_task_file_names(tmp_path):
    names = {(t, s): data.task_file(tmp_path, t, s).name for t in data.TASKS for s in data.SPLITS}
    assert names == {
        ("sst", "train"): "ids-sst-train.csv", ("sst", "dev"): "ids-sst-dev.csv",
        ("sst", "test"): "ids-sst-test-student.csv",
        ("qqp", "train"): "quora-train.csv", ("qqp", "dev"): "quora-dev.csv",
        ("qqp", "test"): "quora-test-student.csv",
        ("sts", "train"): "sts-train.csv", ("sts", "dev"): "sts-dev.csv",
        ("sts", "test"): "sts-test-student.csv",
    }
    assert data.task_file(tmp_path, "sts", "dev").parent == tmp_path
    with pytest.raises(ValueError, match="unknown task"):
        data.task_file(tmp_path, "quora", "dev")  # the task is "qqp"; only its files say quora
    with pytest.raises(ValueError, match="unknown split"):
        data.task_file(tmp_path, "sts", "valid")


# ----------------------------------------------------------------------------- bad input

def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"sts-dev\.csv not found"):
        data.read_sts(tmp_path / "sts-dev.csv")


def test_missing_column_lists_found_columns(tmp_path):
    path = write(tmp_path / "sts.csv", [["", "id", "sentence1", "similarity"],
                                        ["0", "a", "x y", "1.0"]])
    with pytest.raises(DataError) as error:
        data.read_sts(path)
    assert str(error.value) == (f"{path} line 1: missing column 'sentence2' "
                                "(found columns: '', 'id', 'sentence1', 'similarity')")


def test_labeled_modes(tmp_path):
    unlabeled = write(tmp_path / "u.csv", [["", "id", "sentence1", "sentence2"],
                                           ["0", "a", "x", "y"]])
    assert data.read_sts(unlabeled) == [PairExample("a", "x", "y", None)]
    with pytest.raises(DataError, match="missing label column 'similarity'"):
        data.read_sts(unlabeled, labeled=True)
    labeled = write(tmp_path / "l.csv", [STS_HEADER, ["0", "a", "x", "y", "oops"]])
    assert data.read_sts(labeled, labeled=False) == [PairExample("a", "x", "y", None)]


@pytest.mark.parametrize("reader, header, row, message", [
    (data.read_sst, SST_HEADER, ["1", "b", "s", "5"], "sentiment '5' is out of range"),
    (data.read_sst, SST_HEADER, ["1", "b", "s", "-1"], "sentiment '-1' is out of range"),
    (data.read_sst, SST_HEADER, ["1", "b", "s", "2.5"], "sentiment '2.5' is not an integer"),
    (data.read_sst, SST_HEADER, ["1", "b", "s", "pos"], "sentiment 'pos' is not a number"),
    (data.read_qqp, QQP_HEADER, ["1", "b", "s", "t", "2"], "is_duplicate '2' is not 0 or 1"),
    (data.read_qqp, QQP_HEADER, ["1", "b", "s", "t", "0.5"], "is_duplicate '0.5' is not 0"),
    (data.read_qqp, QQP_HEADER, ["1", "b", "s", "t", "yes"],
     "is_duplicate 'yes' is not a number"),
    (data.read_sts, STS_HEADER, ["1", "b", "s", "t", "5.5"], "similarity '5.5' is out of range"),
    (data.read_sts, STS_HEADER, ["1", "b", "s", "t", "nan"], "similarity 'nan' is out of range"),
    (data.read_sts, STS_HEADER, ["1", "b", "s", "t", "abc"], "similarity 'abc' is not a number"),
])
def test_bad_label_names_file_and_line(tmp_path, reader, header, row, message):
    good = ["0", "a", "s", "t", "1"] if len(header) == 5 else ["0", "a", "s", "1"]
    path = write(tmp_path / "task.csv", [header, good, row])
    with pytest.raises(DataError) as error:
        reader(path)
    assert str(error.value).startswith(f"{path} line 3: {message}")


def test_error_is_one_line_in_the_documented_form(tmp_path):
    path = write(tmp_path / "sts-train.csv", [STS_HEADER, ["0", "a", "s", "t", "abc"]])
    with pytest.raises(DataError) as error:
        data.read_sts(path)
    assert str(error.value) == f"{path} line 2: similarity 'abc' is not a number"


def test_accepted_label_spellings(tmp_path):
    labels = ["0", "1", "0.0", "1.0"]
    qqp = write(tmp_path / "q.csv", [QQP_HEADER] + [[str(i), f"id{i}", "s", "t", label]
                                                    for i, label in enumerate(labels)])
    assert [ex.label for ex in data.read_qqp(qqp)] == [0.0, 1.0, 0.0, 1.0]
    sst = write(tmp_path / "s.csv", [SST_HEADER, ["0", "a", "s", "4"], ["1", "b", "s", "0.0"]])
    assert [ex.label for ex in data.read_sst(sst)] == [4, 0]
    sts = write(tmp_path / "t.csv", [STS_HEADER, ["0", "a", "s", "t", "0"],
                                     ["1", "b", "s", "t", "5"]])
    assert [ex.label for ex in data.read_sts(sts)] == [0.0, 5.0]


def test_blank_sentences_and_empty_labels_skipped_with_one_warning(tmp_path, caplog):
    path = write(tmp_path / "q.csv", [
        QQP_HEADER,
        ["0", "a", "first?", "second?", "1.0"],
        ["1", "b", "   ", "second?", "0.0"],
        ["2", "c", "first?", "", "0.0"],
        ["3", "d", "first?", "second?", ""],
        ["4", "e", "first?", "second?", "0"],
    ])
    with caplog.at_level(logging.WARNING, logger="bertcf.data"):
        examples = data.read_qqp(path)
    assert [ex.id for ex in examples] == ["a", "e"]
    (message,) = data_warnings(caplog)
    assert "skipped 3 of 5 rows" in message
    assert "1 with an empty is_duplicate (line 5)" in message
    assert "blank sentence1 (line 3)" in message and "blank sentence2 (line 4)" in message
    # a dev set's read (stage 3's, for every row's prediction): the unlabeled row kept, its label None,
    # the blank ones skipped and said so, in one read of the file
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertcf.data"):
        examples = data.read_qqp(path, labeled=True, keep_unlabeled=True)
    assert [(ex.id, ex.label) for ex in examples] == [("a", 1.0), ("d", None), ("e", 0.0)]
    (message,) = data_warnings(caplog)
    assert "skipped 2 of 5 rows" in message and "empty is_duplicate" not in message


def test_no_warning_for_clean_file(tmp_path, caplog):
    path = write(tmp_path / "s.csv", [SST_HEADER, ["0", "a", " A film .", "2"]])
    assert data.read_sst(path) == [SentenceExample("a", "A film .", 2)]  # leading space stripped
    assert data_warnings(caplog) == []


def test_selects_columns_by_name_and_parses_quotes(tmp_path):
    # Shifted header like ids-sst-test-student.csv, a quoted field with a tab and "" inside.
    path = write(tmp_path / "s.csv", '0\t\tid\tsentence\n1\t0.0\tx1\t"say ""hi""\tthere"\n')
    assert data.read_sst(path) == [SentenceExample("x1", 'say "hi"\tthere', None)]


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("\tid\tsentence\tsentiment\n", "has no usable rows"),
    ("\tid\tsentence\tsentiment\n0\ta\t \t1\n", r"has no usable rows \(of 1\)"),
])
def test_empty_files(tmp_path, content, message):
    path = write(tmp_path / "ids-sst-dev.csv", content)
    with pytest.raises(DataError, match=message):
        data.read_sst(path)


def test_wrong_field_count_and_empty_id(tmp_path):
    path = write(tmp_path / "s.csv", [SST_HEADER, ["0", "a", "s", "1"], ["1", "b", "s"]])
    with pytest.raises(DataError, match=r"line 3: expected 4 tab-separated fields, found 3"):
        data.read_sst(path)
    path = write(tmp_path / "s.csv", [SST_HEADER, ["0", "", "s", "1"]])
    with pytest.raises(DataError, match=r"line 2: empty id"):
        data.read_sst(path)


def test_not_utf8(tmp_path):
    path = tmp_path / "s.csv"
    path.write_bytes(b"\tid\tsentence\tsentiment\n0\ta\t\xff\xfe\t1\n")
    with pytest.raises(DataError, match="not valid UTF-8"):
        data.read_sst(path)


# ----------------------------------------------------------------------------- corpora

def test_read_corpus_filters_short_and_blank(tmp_path, caplog):
    path = write(tmp_path / "c.txt", "one two three four five six\r\n"
                                     "\n"
                                     "  only five words here ok  \n"
                                     "   \n"
                                     "  a b c d e f g  \n"
                                     "last line without newline but long enough")
    with caplog.at_level(logging.INFO, logger="bertcf.data"):
        sentences = data.read_corpus(path)
    assert sentences == ["one two three four five six", "a b c d e f g",
                         "last line without newline but long enough"]
    (message,) = data_warnings(caplog)
    assert "skipped 2 blank lines" in message and "dropped 1 with fewer than 6 words" in message
    assert data.read_corpus(path, min_words=0) == [
        "one two three four five six", "only five words here ok", "a b c d e f g",
        "last line without newline but long enough"]


def test_read_corpus_errors(tmp_path):
    with pytest.raises(DataError, match="corpus .*nope.txt not found"):
        data.read_corpus(tmp_path / "nope.txt")
    empty = write(tmp_path / "empty.txt", "\n \n")
    with pytest.raises(DataError, match="is empty"):
        data.read_corpus(empty)
    short = write(tmp_path / "short.txt", "too short\nalso short here\n")
    with pytest.raises(DataError, match=r"short\.txt has no sentences with at least 6 words"):
        data.read_corpus(short)
    with pytest.raises(ValueError):
        data.read_corpus(short, min_words=-1)


def _write_task_train_files(directory: Path) -> None:
    write(directory / "ids-sst-train.csv", [SST_HEADER, ["0", "a", " A good film .", "3"],
                                            ["1", "b", " Shared sentence", "1"],
                                            ["2", "c", " A good film .", "2"]])
    write(directory / "quora-train.csv", [QQP_HEADER, ["0", "d", "Shared sentence", "Why?", "1.0"],
                                          ["1", "e", "Why?", "How so?", ""]])
    write(directory / "sts-train.csv", [STS_HEADER, ["0", "f", "How so?", "A cat sits.", "2.0"]])


def test_task_sentences_dedup_in_order(tmp_path):
    _write_task_train_files(tmp_path)
    assert data.task_sentences(tmp_path) == [
        "A good film .", "Shared sentence", "Why?", "How so?", "A cat sits."]
    assert data.task_sentences(tmp_path, min_words=3) == ["A good film .", "A cat sits."]


def test_task_sentences_missing_file(tmp_path):
    _write_task_train_files(tmp_path)
    (tmp_path / "quora-train.csv").unlink()
    with pytest.raises(DataError, match=r"quora-train\.csv"):
        data.task_sentences(tmp_path)


# ----------------------------------------------------------------------------- downloader

def test_checksum_kinds(tmp_path):
    path = write(tmp_path / "hello", "hello\n")
    assert download.file_checksum(path, "git-blob") == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert download.file_checksum(path, "sha256") == hashlib.sha256(b"hello\n").hexdigest()
    empty = write(tmp_path / "empty", "")
    assert download.file_checksum(empty, "git-blob") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def test_default_sources():
    cs224n = {s.name: s for s in download.SOURCES["cs224n"]}
    assert set(cs224n) == set(data.TASK_FILES.values())
    for name, source in cs224n.items():
        assert source.url == ("https://raw.githubusercontent.com/gpoesia/minbert-default-final-"
                              "project/7ac8260577fc12a86c7aaf38918056c30054ef39/data/" + name)
        assert source.checksum.split(":")[0] in ("sha256", "git-blob")
    assert cs224n["quora-train.csv"].checksum == "git-blob:a3b5546f6a0e65b60a328a5d294d1038f5bed1da"
    (wiki,) = download.SOURCES["wiki1m"]
    assert wiki.name == "wiki1m_for_simcse.txt" and wiki.lines == 1_000_000
    assert wiki.checksum is None and wiki.url.startswith("https://huggingface.co/")


def _files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.exists() else set()


def test_download_good_file_then_skip(server, tmp_path, capsys):
    root, base = server
    body = b"good content\n"
    write(root / "good.txt", body.decode())
    out = tmp_path / "out"
    sources = [Source("good.txt", base + "good.txt", "sha256:" + hashlib.sha256(body).hexdigest())]
    assert download.download(out, sources=sources, progress=False) == {"good.txt": None}
    assert (out / "good.txt").read_bytes() == body and _files(out) == {"good.txt"}
    assert "good.txt: downloaded (sha256 ok)" in capsys.readouterr().out
    # Second run: present and valid, so the server is not asked (it no longer has the file).
    (root / "good.txt").unlink()
    assert download.download(out, sources=sources, progress=False) == {"good.txt": None}
    assert "good.txt: ok (already present)" in capsys.readouterr().out


def test_download_replaces_invalid_present_file(server, tmp_path, capsys):
    root, base = server
    body = b"blob content\n"
    write(root / "f.csv", body.decode())
    blob_id = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
    out = tmp_path / "out"
    out.mkdir()
    write(out / "f.csv", "stale\n")
    results = download.download(out, sources=[Source("f.csv", "unused", "git-blob:" + blob_id)],
                            base_url=base, progress=False)
    assert results == {"f.csv": None} and (out / "f.csv").read_bytes() == body
    assert "present but invalid" in capsys.readouterr().out


def test_download_corrupt_file_fails_cleanly(server, tmp_path, capsys):
    root, base = server
    write(root / "bad.txt", "tampered\n")
    out = tmp_path / "out"
    source = Source("bad.txt", base + "bad.txt", "sha256:" + "0" * 64)
    results = download.download(out, sources=[source], progress=False)
    assert "sha256 mismatch" in results["bad.txt"]
    assert _files(out) == set()  # neither bad.txt nor bad.txt.part
    assert "bad.txt: FAILED" in capsys.readouterr().err


def test_download_missing_file_fails(server, tmp_path, capsys):
    _, base = server
    out = tmp_path / "out"
    source = Source("gone.txt", base + "gone.txt", "sha256:" + "0" * 64)
    results = download.download(out, sources=[source], progress=False)
    assert results["gone.txt"].startswith("HTTP 404")
    assert _files(out) == set()
    assert "gone.txt: FAILED: HTTP 404" in capsys.readouterr().err


def test_download_without_checksum_counts_lines_and_records_sha256(server, tmp_path, capsys):
    root, base = server
    body = "line one\nline two\nline three\n"
    write(root / "corpus.txt", body)
    out = tmp_path / "out"
    source = Source("corpus.txt", base + "corpus.txt", None, lines=3)
    assert download.download(out, sources=[source], progress=False) == {"corpus.txt": None}
    sha256 = hashlib.sha256(body.encode()).hexdigest()
    assert (out / "corpus.txt.sha256").read_text() == f"{sha256}  corpus.txt\n"
    assert sha256 in capsys.readouterr().out
    # Wrong line count: rejected, nothing left under the final name.
    wrong = Source("corpus.txt", base + "corpus.txt", None, lines=4)
    (out / "corpus.txt").unlink()
    result = download.download(out, sources=[wrong], progress=False)["corpus.txt"]
    assert "has 3 lines, expected 4" in result
    assert not (out / "corpus.txt").exists()
    # The server now serves other content with the right line count: differs from the record.
    write(root / "corpus.txt", "other one\nother two\nother three\n")
    result = download.download(out, sources=[source], progress=False)["corpus.txt"]
    assert "differs from the one recorded" in result
    assert _files(out) == {"corpus.txt.sha256"}


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_main_without_network_prints_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("no_proxy", "*")
    out = tmp_path / "data"
    rc = data_main(["download", "--out", str(out), "--only", "cs224n", "--timeout", "5",
                    "--base-url", f"http://127.0.0.1:{_refused_port()}/"])
    captured = capsys.readouterr()
    assert rc == 1
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert str(out) in lines[0] and "data/README.md" in lines[0] and "by hand" in lines[0]
    assert all(name in lines[0] for name in data.TASK_FILES.values())
    assert "Traceback" not in captured.err + captured.out
    assert _files(out) == set()


@needs_shared
def test_main_with_real_checksums(server, tmp_path, capsys):
    root, base = server
    for path in SHARED.glob("*.csv"):
        shutil.copy(path, root / path.name)
    out = tmp_path / "data"
    argv = ["download", "--out", str(out), "--only", "cs224n", "--base-url", base, "--no-progress"]
    assert data_main(argv) == 1  # quora-train.csv and quora-test-student.csv are not served
    captured = capsys.readouterr()
    assert "2 of 9 files failed: quora-train.csv, quora-test-student.csv" in captured.err
    assert _files(out) == {p.name for p in SHARED.glob("*.csv")}
    assert data_main(argv) == 1
    assert captured.out.count("downloaded (sha256 ok)") == 7
    assert capsys.readouterr().out.count("ok (already present)") == 7


def test_real_cs224n_files_read_whole(cs224n_dir, offline_data_dir):
    """The readers on the real CS224N files (shared/): every row, labels in range. QQP rows with
    an empty is_duplicate are skipped (2 in quora-dev.csv, 2 in the offline quora-train.csv)."""
    expected = {("sst", "train"): 8544, ("sst", "dev"): 1101, ("sts", "train"): 6040, ("sts", "dev"): 863}
    for directory in (cs224n_dir, offline_data_dir):
        for (task, split), n in expected.items():
            examples = data.read_task(directory, task, split)
            assert len(examples) == n, (directory, task, split)
        assert {e.label for e in data.read_task(directory, "sst", "train")} == {0, 1, 2, 3, 4}
        assert all(0.0 <= e.label <= 5.0 for e in data.read_task(directory, "sts", "dev"))
    assert len(data.read_task(cs224n_dir, "qqp", "dev")) == 20214 - 2
    assert [len(data.read_task(offline_data_dir, "qqp", s)) for s in ("train", "dev")] == [16260 - 2, 3954]
    assert {e.label for e in data.read_task(offline_data_dir, "qqp", "train")} == {0.0, 1.0}


def _senteval_tar(path: Path, prefix: str = "SentEval/data/downstream/") -> Path:
    """A tar shaped like SimCSE's senteval.tar: SentEval's data/downstream/ tree under a prefix."""
    import io
    import tarfile
    members = {"STS/STSBenchmark/sts-test.csv": "g\tf\ty\t1\t2.5\ta b\tc d\n", "CR/custrev.pos": "fine .\n"}
    with tarfile.open(path, "w") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def test_download_senteval_unpacks_and_records_sha256(server, tmp_path, capsys):
    root, base = server
    archive = _senteval_tar(root / "senteval.tar")
    out = tmp_path / "data"
    argv = ["download", "--senteval", "--out", str(out), "--base-url", base, "--no-progress"]
    assert data_main(argv) == 0
    assert (out / "SentEval" / "STS" / "STSBenchmark" / "sts-test.csv").read_text().startswith("g\tf")
    assert (out / "SentEval" / "CR" / "custrev.pos").is_file()
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert (out / "senteval.tar.sha256").read_text() == f"{sha256}  senteval.tar\n"
    assert not list(out.glob(".SentEval*"))  # no staging folder left
    assert data_main(argv) == 0
    assert "already unpacked" in capsys.readouterr().out


def test_download_senteval_rejects_a_changed_or_broken_archive(server, tmp_path, capsys):
    root, base = server
    out = tmp_path / "data"
    out.mkdir()
    (out / "senteval.tar.sha256").write_text("0" * 64 + "  senteval.tar\n")
    _senteval_tar(root / "senteval.tar")
    argv = ["download", "--senteval", "--out", str(out), "--base-url", base, "--no-progress"]
    assert data_main(argv) == 1  # differs from the recorded sha256
    assert "differs from the one recorded" in capsys.readouterr().err
    (out / "senteval.tar.sha256").unlink()
    (root / "senteval.tar").write_bytes(b"not a tar at all" * 100)
    assert data_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a valid tar archive" in err[0]
    assert not (out / "SentEval").exists() and not list(out.glob(".SentEval*"))


def test_download_senteval_offline_says_where_to_put_the_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("no_proxy", "*")
    out = tmp_path / "data"
    rc = data_main(["download", "--senteval", "--out", str(out), "--timeout", "5",
                    "--base-url", f"http://127.0.0.1:{_refused_port()}/"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1
    assert f"{out}/SentEval/" in err[0] and "senteval.tar" in err[0]
