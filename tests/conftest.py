"""Shared pytest fixtures: a tiny random-weight BERT checkpoint, the shared data folders, and a
small CS224N-format data directory.

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
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest


def _closed_port() -> int:
    """A local port where nothing listens (bound, then let go)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The commands download the data they miss (bertcf.data.download.fetch_missing). No test reaches
# the network: a download that a test does not serve itself (its own local server, as in
# test_data.py) goes to a local port where nothing listens and fails at once, as offline. Set here,
# so the processes that tests start inherit it too.
os.environ["BERTCF_DATA_URL"] = f"http://127.0.0.1:{_closed_port()}/"
os.environ["no_proxy"] = ",".join(filter(None, [os.environ.get("no_proxy"), "127.0.0.1"]))

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
REAL_VOCAB = SHARED / "models" / "bert-base-uncased-vocab" / "vocab.txt"
REAL_BERT_ENV = "BERTCF_REAL_BERT"

#: The configuration of ``tiny_bert_dir`` (vocab_size is that of ``vocab_path``).
TINY_BERT_CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.1,
                        pad_token_id=0)


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


# ----------------------------------------------------------------------------- vocabulary

_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = """
the a an of to and in is was it that for on with as by at from this be are not but or have has had
he she they we you i his her their our my its me him them us who what which when where why how all
any some no one two three four five six seven eight nine ten first last new old good bad great best
worst little big long short high low small large more most less very too so just only also even
still well much many few other same such own than then there here now out up down over under again
man woman men women child children people person dog dogs cat cats horse bird fish car cars train
bus plane boat guitar piano music song songs film films movie movies story stories book books game
play plays playing played player sing sings singing dance dancing run runs running walk walking ride
riding eat eats eating cook cooking cut cutting write writing read reading talk talking speak said
says say see seen look looks looking make makes made take takes took give gives go goes going went
come comes came know knows think thinks want wants like likes love loves hate feel feels find found
get gets got work works working day days year years time times week night morning world country city
house home street water food field grass beach road table room school market price prices company
government police president minister war peace attack attacks killed election elections talks
question questions answer answers way ways best better learn learning online money business india
china france paris capital lovely funny boring beautiful stupid smart slow fast happy sad nice dull
red black white blue green young boy girl boys girls stage band performing on off into through
about after before during while because if would could should can will may might must do does did
""".split()
_PUNCT = list(".,!?'\"-:;()[]/&%$#@*+=<>0123456789")
_LETTERS = list("abcdefghijklmnopqrstuvwxyz")
_SUFFIXES = ["##s", "##es", "##ed", "##ing", "##ly", "##er", "##est", "##n't", "##'s"]


def synthetic_vocab() -> list[str]:
    """A small lowercase WordPiece vocabulary: the special tokens ([PAD] = 0, [UNK] = 1, [CLS] = 2,
    [SEP] = 3, [MASK] = 4), a few hundred words, punctuation, digits, and every letter both
    word-initial and as a ``##`` continuation, so any lowercase ASCII text tokenises without [UNK]."""
    tokens = _SPECIAL + _PUNCT + _LETTERS + [f"##{c}" for c in _LETTERS + list("0123456789")] + _SUFFIXES
    seen = set(tokens)
    for w in _WORDS:
        if w not in seen:
            seen.add(w)
            tokens.append(w)
    return tokens


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


# ----------------------------------------------------------------------------- checkpoints

def make_hf_bert_dir(directory: Path, vocab: Path, seed: int = 0, **config) -> Path:
    """Write a random-weight ``transformers.BertModel`` (``save_pretrained``) plus a
    ``BertTokenizerFast`` over ``vocab`` into ``directory``; config values override
    :data:`TINY_BERT_CONFIG`. Returns ``directory``."""
    import torch
    import transformers

    vocab_size = sum(1 for line in Path(vocab).read_text(encoding="utf-8").splitlines() if line)
    settings = {**TINY_BERT_CONFIG, "vocab_size": vocab_size, **config}
    torch.manual_seed(seed)
    model = transformers.BertModel(transformers.BertConfig(**settings), add_pooling_layer=True)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    transformers.BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(str(directory))
    return directory


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


# ----------------------------------------------------------------------------- CS224N-format data

_SUBJECTS = ["the man", "a woman", "the dog", "the band", "a young girl", "the president", "my friend",
             "the old company", "a cat", "the children"]
_VERBS = ["is playing a guitar", "plays the piano", "is cutting an onion", "is riding a horse",
          "talks about the election", "walks down the street", "is eating food", "sings a song",
          "is running on the beach", "reads a book"]
_TAILS = ["", " in the morning", " with a smile on his face", " while the rain keeps falling over the old city",
          " , which is probably for the best", " near the market"]
_SST = [" It 's a lovely film with lovely performances .", " Boring .", " The Rock is destined to be the 21st "
        "Century 's new `` Conan '' and that he 's going to make a splash even greater than Arnold "
        "Schwarzenegger .", " No one goes unindicted here , which is probably for the best .",
        " Never -LRB- sinks -RRB- into exploitation .", " A dull , stupid movie .", " Funny and smart .",
        " The gorgeously elaborate continuation of `` The Lord of the Rings '' trilogy is so huge that a "
        "column of words can not adequately describe it ."]


def _sentence(i: int) -> str:
    s = f"{_SUBJECTS[i % len(_SUBJECTS)]} {_VERBS[(3 * i + 1) % len(_VERBS)]}{_TAILS[i % len(_TAILS)]}"
    return s[0].upper() + s[1:] + "."


_ACTIONS = ["learn the guitar", "make money online", "cook rice", "learn english", "read more books",
            "find a good school", "get a job in india", "stop thinking about the past", "train a dog",
            "speak in public"]


def _question(i: int) -> str:
    return f"What is the best way to {_ACTIONS[i % len(_ACTIONS)]}{_TAILS[(i + 2) % len(_TAILS)]}?"


def _id(*parts) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:25]


def write_cs224n_files(directory: Path, n_train: int = 24, n_dev: int = 12, n_test: int = 8) -> Path:
    """Write all nine CS224N files (ids-sst-, quora-, sts- × train, dev, test-student) in the real
    tab-separated format: a header line, a leading unnamed index column, the shifted header of
    ids-sst-test-student.csv, SST sentences with a leading space, Quora labels 0.0/1.0 and a
    CSV-quoted question with doubled quotes, STS similarities 0.0-5.0. Returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)

    def write(name, header, rows):
        lines = ["\t".join(header)] + ["\t".join(map(str, r)) for r in rows]
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")

    sizes = {"train": n_train, "dev": n_dev}
    for split, n in sizes.items():
        sst = [[i, _id("sst", split, i), _SST[i % len(_SST)] if i % 3 == 0 else " " + _sentence(i + 7 * len(split)),
                i % 5] for i in range(n)]
        write(f"ids-sst-{split}.csv", ["", "id", "sentence", "sentiment"], sst)
        quora = []
        for i in range(n):
            q1 = _question(i + len(split))
            q2 = q1.replace("best", "easiest") if i % 2 == 0 else _question(i + 3 + len(split))
            if i == 1:  # a CSV-quoted question with doubled inner quotes, as in the real files
                q1 = '"Do I need ""the"" here, or is it ""a""?"'
            quora.append([1000 + i, _id("quora", split, i), q1, q2, f"{float(i % 2 == 0)}"])
        write(f"quora-{split}.csv", ["", "id", "sentence1", "sentence2", "is_duplicate"], quora)
        sts = [[2000 + i, _id("sts", split, i), _sentence(i), _sentence(i if i % 3 else i + 1).replace("the", "a"),
                f"{(i * 0.7) % 5.0:.1f}" if i % 4 else ("5.0" if i % 8 == 0 else "0.0")] for i in range(n)]
        write(f"sts-{split}.csv", ["", "id", "sentence1", "sentence2", "similarity"], sts)
    # Test files have no label column; the SST one has the real file's shifted header.
    write("ids-sst-test-student.csv", ["0", "", "id", "sentence"],
          [[i + 1, f"{float(i)}", _id("sst", "test", i), " " + _sentence(i + 3)] for i in range(n_test)])
    write("quora-test-student.csv", ["", "id", "sentence1", "sentence2"],
          [[3000 + i, _id("quora", "test", i), _question(i), _question(i + 1)] for i in range(n_test)])
    write("sts-test-student.csv", ["", "id", "sentence1", "sentence2"],
          [[4000 + i, _id("sts", "test", i), _sentence(i + 2), _sentence(i + 5)] for i in range(n_test)])
    return directory


@pytest.fixture
def tiny_data_dir(tmp_path) -> Path:
    """A fresh ``--data-dir`` (under this test's ``tmp_path``) holding all nine CS224N files in the
    real format (see :func:`write_cs224n_files`): 24 train rows, 12 dev and 8 test per task,
    SST labels 0-4, Quora 0.0/1.0 (half duplicates), STS similarities in [0, 5]. Free to modify."""
    return write_cs224n_files(tmp_path / "data")


def make_objective(stage: str, method: str, encoder, generator=None, examples=None, **settings):
    """The objective of ``--stage``/``--method`` on ``encoder``, built as ``run_pretrain.py`` builds
    it: ``settings`` are its keyword settings (those of other objectives are left out, as a run's
    flags are; ``pooling="cls-mlp"`` gives SimCSE's MLP), ``examples`` size a supervised head."""
    from bertcf.objectives import objective_class

    cls = objective_class(stage, method)
    run = {"mlp": settings.pop("pooling", None) == "cls-mlp"} | {k: settings.pop(k) for k in ("max_length", "checkpoint")
                                                                if k in settings}
    kwargs = {k: v for k, v in settings.items() if k in cls.setting_names() or k == "mini_batch_size"}
    kwargs |= {k: v for k, v in run.items() if k in cls.RUN_SETTINGS}
    if examples is not None and stage == "supervised":
        kwargs |= cls.from_examples(examples)
    return cls(encoder, generator=generator, **kwargs)


def record_pretrainings(monkeypatch, run: bool = True) -> list:
    """The argv of every pretraining run the experiments command starts from now on, in order;
    ``run``: whether they still run (else they are only recorded)."""
    from bertcf.experiments import execute

    calls, real = [], execute.run_planned

    def recording(kind, argv):
        if kind == "pretraining":
            calls.append(argv)
            if not run:
                return {}
        return real(kind, argv)
    monkeypatch.setattr(execute, "run_planned", recording)
    return calls
