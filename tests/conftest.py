"""Shared pytest fixtures: a tiny random-weight BERT checkpoint, the shared data folders, a small
CS224N-format data directory, a tiny pretraining run's data, an MLM checkpoint, a local HTTP
server. Fixtures need no import; what test modules import (the helpers: data writers, a run's
argv, the objectives' batches, ...) is ``helpers.py``, ``from helpers import ...``.

Everything here works offline and without ``../shared`` (a command's own download of missing data
goes to a closed local port: ``BERTCF_DATA_URL`` below): when the shared uncased vocabulary is
absent a small synthetic WordPiece vocabulary is written instead, and fixtures that need the real
data files skip the test with a reason.

Fixtures (scope):
    shared_dir (session)        Path to ``../shared`` beside the repository, or None.
    vocab_path (session)        a BERT ``vocab.txt``: the real uncased one, or a synthetic one.
    real_vocab_path (session)   the real uncased ``vocab.txt``; skips the test when absent.
    tiny_bert_dir (session)     a random-weight Hugging Face BERT directory (hidden 32, 2 layers).
    real_bert_dir (session)     ``$BERTCF_REAL_BERT`` (a real HF BERT directory); skips when unset.
    cs224n_dir (session)        ``shared/data/cs224n``; skips when absent.
    offline_data_dir (session)  ``shared/data/cs224n-offline``; skips when absent.
    tiny_data_dir (function)    a fresh ``--data-dir`` with all nine CS224N files, a few rows each.
    one_thread (module)         one intra-op torch thread for the module's tests; not autouse: a module
                                asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    data_dir (module)           sts-dev.csv and corpus.txt for tiny pretraining runs (``base_args``);
                                a module's own ``data_dir`` wins over it there.
    mlm_dir (module)            a random-weight ``BertForMaskedLM`` directory with a non-trivial head.
    server (function)           a local HTTP server serving ``tmp_path/'srv'``: (dir, base URL).
"""
from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest
from helpers import (
    PRETRAIN_WORDS,
    REAL_BERT_ENV,
    REAL_VOCAB,
    SHARED,
    TINY_MLM_CONFIG,
    make_hf_bert_dir,
    pretrain_sentence,
    synthetic_vocab,
    write_cs224n_files,
)


def _closed_port() -> int:
    """A local port where nothing listens (bound, then let go)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The commands download the data they miss (bertcf.data.download.fetch_missing). No test reaches
# the network: a download that a test does not serve itself (its own local server: the ``server``
# fixture below) goes to a local port where nothing listens and fails at once, as offline. Set here,
# so the processes that tests start inherit it too.
os.environ["BERTCF_DATA_URL"] = f"http://127.0.0.1:{_closed_port()}/"
os.environ["no_proxy"] = ",".join(filter(None, [os.environ.get("no_proxy"), "127.0.0.1"]))


# ----------------------------------------------------------------------------- shared folders

@pytest.fixture(scope="session")
def shared_dir() -> Path | None:
    """``../shared`` beside the repository (data and vocabulary), or None where it is absent (CI)."""
    return SHARED if SHARED.is_dir() else None


@pytest.fixture(scope="session")
def cs224n_dir() -> Path:
    """``shared/data/cs224n`` (the original CS224N files we hold; no quora-train/test). Skips if absent."""
    path = SHARED / "data" / "cs224n"
    if not path.is_dir():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(scope="session")
def offline_data_dir() -> Path:
    """``shared/data/cs224n-offline``: a complete ``--data-dir`` (no quora-test-student.csv).
    Skips if absent."""
    path = SHARED / "data" / "cs224n-offline"
    if not path.is_dir():
        pytest.skip(f"{path} not present")
    return path


# ----------------------------------------------------------------------------- vocabulary and checkpoints

@pytest.fixture(scope="session")
def vocab_path(tmp_path_factory) -> Path:
    """A BERT ``vocab.txt``: the real bert-base-uncased vocabulary from ``shared/`` when present,
    otherwise the synthetic one of :func:`synthetic_vocab` written to a temporary folder."""
    if REAL_VOCAB.is_file():
        return REAL_VOCAB
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(synthetic_vocab()) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def real_vocab_path() -> Path:
    """The real uncased ``shared/models/bert-base-uncased-vocab/vocab.txt``; skips when absent."""
    if not REAL_VOCAB.is_file():
        pytest.skip(f"{REAL_VOCAB} not present")
    return REAL_VOCAB


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, vocab_path) -> Path:
    """A Hugging Face BERT directory with random weights (seed 0) and :data:`TINY_BERT_CONFIG`
    (hidden 32, 2 layers, 4 heads, intermediate 64, 64 positions): ``config.json``,
    ``model.safetensors`` and the tokenizer files for ``vocab_path``. Loads with
    ``minbert.BertModel.from_pretrained``, ``bertcf.SentenceEncoder.from_pretrained`` and
    ``transformers.BertModel.from_pretrained``. Shared by the whole session: treat it as
    read-only (copy it with ``shutil.copytree`` before changing anything)."""
    return make_hf_bert_dir(tmp_path_factory.mktemp("tiny-bert"), vocab_path)


@pytest.fixture(scope="session")
def real_bert_dir() -> Path:
    """The real Hugging Face BERT directory named by ``$BERTCF_REAL_BERT`` (e.g. the MiniLM from
    ``shared/tools/get-minilm.sh``); skips the test when the variable is unset."""
    value = os.environ.get(REAL_BERT_ENV)
    if not value:
        pytest.skip(f"set {REAL_BERT_ENV} to a Hugging Face BERT directory to run this test")
    path = Path(value)
    if not (path / "config.json").is_file():
        pytest.fail(f"{REAL_BERT_ENV}={value} is not a Hugging Face BERT directory (no config.json)")
    return path


# ----------------------------------------------------------------------------- data

@pytest.fixture
def tiny_data_dir(tmp_path) -> Path:
    """A fresh ``--data-dir`` (under this test's ``tmp_path``) holding all nine CS224N files in the
    real format (see :func:`write_cs224n_files`): 24 train rows, 12 dev and 8 test per task,
    SST labels 0-4, Quora 0.0/1.0 (half duplicates), STS similarities in [0, 5]. Free to modify."""
    return write_cs224n_files(tmp_path / "data")


# ----------------------------------------------------------------------------- one thread

@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is several times faster than
    two threads competing with other processes (and it does not change any result here). Not
    autouse: a module asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- pretraining runs and objectives

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """sts-dev.csv (16 pairs, gold 0-5, some >= 4) and corpus.txt (40 sentences of 6-14 words).
    Modules that define their own ``data_dir`` get theirs."""
    import random

    d = tmp_path_factory.mktemp("pretrain-data")
    rng = random.Random(0)
    rows = ["\tid\tsentence1\tsentence2\tsimilarity"]
    for i in range(16):
        s1 = pretrain_sentence(rng, rng.randint(4, 10))
        s2 = s1 if i % 4 == 0 else pretrain_sentence(rng, rng.randint(4, 10))  # some near-identical pairs
        if i % 4 == 0:
            s2 = s2 + " " + rng.choice(PRETRAIN_WORDS)
        gold = 4.5 if i % 4 == 0 else round(rng.uniform(0, 3.5), 1)
        rows.append(f"{i}\tid{i:03d}\t{s1}\t{s2}\t{gold}")
    (d / "sts-dev.csv").write_text("\n".join(rows) + "\n")
    (d / "corpus.txt").write_text("\n".join(pretrain_sentence(rng, rng.randint(6, 14)) for _ in range(40)) + "\n")
    return d


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory, vocab_path):
    """A random-weight transformers.BertForMaskedLM (save_pretrained) with a non-trivial head."""
    import torch
    import transformers

    vocab_size = sum(1 for line in vocab_path.read_text(encoding="utf-8").splitlines() if line)
    torch.manual_seed(3)
    model = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=vocab_size, **TINY_MLM_CONFIG))
    with torch.no_grad():  # the head's biases and LayerNorm start at 0 / 1: make them recognisable
        for name, p in model.cls.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
    directory = tmp_path_factory.mktemp("tiny-mlm")
    model.save_pretrained(str(directory))
    transformers.BertTokenizerFast(vocab=str(vocab_path), do_lower_case=True).save_pretrained(str(directory))
    return directory


# ----------------------------------------------------------------------------- a local HTTP server

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local HTTP server on a random port serving tmp_path/'srv'; yields (dir, base URL)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    root = tmp_path / "srv"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
