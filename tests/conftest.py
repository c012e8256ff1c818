"""Shared pytest fixtures and helpers: a tiny random-weight BERT checkpoint, the shared data
folders, a small CS224N-format data directory, and what more than one test module uses (a tiny
pretraining run's data and argv, the objectives' batches, NLI sentences, a local HTTP server, a
tiny SentEval directory, sentence-transformers in a process without bertcf). Test modules import
the helpers with ``from conftest import ...``; fixtures need no import.

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

Helpers: ``make_objective``, ``record_pretrainings``, ``write_cs224n_files``, ``make_hf_bert_dir``,
``offline_hub_cache`` (a hub name served from a fresh local cache, offline);
``base_args``, ``run_quiet``, ``exit_status``, ``assert_one_error_line``, ``tensors``,
``training_state`` (run_pretrain.py runs); ``OBJECTIVE_SENTENCES``, ``load``, ``batch``,
``random_batch`` (objectives on a batch); ``PREMISES``, ``ENTAILED``, ``NEUTRAL``,
``CONTRADICTED``, ``stacked`` (NLI columns); ``write_senteval``, ``write_sts_year``,
``write_lines``, ``senteval_sentence`` (SentEval files); ``ST_SENTENCES``, ``standalone_vectors``
(sentence-transformers where bertcf is not installed).
"""
from __future__ import annotations

import functools
import hashlib
import http.server
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # torch and bertcf load when a fixture or helper first needs them
    import torch

    from bertcf.models.encoder import SentenceEncoder


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


# ----------------------------------------------------------------------------- the hub, offline

def offline_hub_cache(monkeypatch, tmp_path, name: str, files_from) -> None:
    """Put the files of ``files_from`` into a fresh Hugging Face hub cache as repository ``name``
    (the layout huggingface_hub writes: refs/main -> snapshots/<commit>/) and go offline, so a
    hub name resolves from the cache alone."""
    import shutil

    import huggingface_hub.constants

    cache = tmp_path / "hub-cache"
    repo = cache / ("models--" + name.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(files_from, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    # huggingface_hub reads these environment variables when imported, so set its constants too.
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


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


# ----------------------------------------------------------------------------- pretraining runs

#: The words of ``data_dir``'s sentences.
PRETRAIN_WORDS = ("the a man woman dog cat child band girl boy plays runs eats sits walks reads sings cooks "
                  "on in under near with across park street house table garden ball guitar piano book song "
                  "red blue small big happy old young two three black white grass water car bike quickly "
                  "slowly morning evening city river beach stage music food").split()


def _words_sentence(rng, n: int) -> str:
    return " ".join(rng.choice(PRETRAIN_WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """sts-dev.csv (16 pairs, gold 0-5, some >= 4) and corpus.txt (40 sentences of 6-14 words).
    Modules that define their own ``data_dir`` get theirs."""
    import random

    d = tmp_path_factory.mktemp("pretrain-data")
    rng = random.Random(0)
    rows = ["\tid\tsentence1\tsentence2\tsimilarity"]
    for i in range(16):
        s1 = _words_sentence(rng, rng.randint(4, 10))
        s2 = s1 if i % 4 == 0 else _words_sentence(rng, rng.randint(4, 10))  # some near-identical pairs
        if i % 4 == 0:
            s2 = s2 + " " + rng.choice(PRETRAIN_WORDS)
        gold = 4.5 if i % 4 == 0 else round(rng.uniform(0, 3.5), 1)
        rows.append(f"{i}\tid{i:03d}\t{s1}\t{s2}\t{gold}")
    (d / "sts-dev.csv").write_text("\n".join(rows) + "\n")
    (d / "corpus.txt").write_text("\n".join(_words_sentence(rng, rng.randint(6, 14)) for _ in range(40)) + "\n")
    return d


def base_args(bert_dir, data_dir, out_dir, steps=6, **flags) -> list[str]:
    """run_pretrain.py's argv for a tiny CPU run on ``data_dir``; ``flags`` add or override
    options (``lr=1e-3`` is ``--lr 1e-3``, True a bare flag, None leaves the option out)."""
    settings = {"model": bert_dir, "data-dir": data_dir, "corpus": Path(data_dir) / "corpus.txt", "out-dir": out_dir,
                "steps": steps, "batch-size": 4, "max-length": 24, "eval-every": 3, "log-every": 1,
                "device": "cpu", "precision": "fp32"} | {k.replace("_", "-"): v for k, v in flags.items()}
    argv = []
    for k, v in settings.items():
        if v is None:
            continue
        argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return argv


def run_quiet(argv) -> tuple[dict, str]:
    """pretrain.run(argv) with stdout captured (the final summary line); returns (summary, stdout)."""
    import contextlib
    import io

    from bertcf.commands import pretrain

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = pretrain.run(argv)
    return summary, out.getvalue()


def tensors(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def training_state(run_dir) -> dict:
    import torch

    from bertcf import runs

    return torch.load(Path(run_dir) / "last" / runs.STATE_FILE, map_location="cpu", weights_only=False)


def assert_one_error_line(capsys, *needles):
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    assert len(err.splitlines()) == 1, f"expected one line on stderr, got: {captured.err!r}"
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def exit_status(argv) -> int:
    """run_pretrain.py's exit status for ``argv`` (argparse's own errors included)."""
    from bertcf.cli import run_main
    from bertcf.commands import pretrain

    try:
        return run_main(pretrain.run, argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


# ----------------------------------------------------------------------------- objectives on a batch

OBJECTIVE_SENTENCES = [
    "The man is playing a guitar in the morning.",
    "A woman plays the piano.",
    "The dog is running on the beach with a smile on his face.",
    "A young girl sings a song near the market.",
    "The president talks about the election.",
    "My friend reads a book while the rain keeps falling over the old city.",
]

#: BertForMaskedLM settings of the MLM checkpoint (the size of the tiny BERT).
TINY_MLM_CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                       max_position_embeddings=64, initializer_range=0.1)


def load(path, dropout: float = 0.0) -> SentenceEncoder:
    """A SentenceEncoder (dropout 0 unless asked: deterministic forward passes)."""
    from bertcf.models.encoder import SentenceEncoder

    return SentenceEncoder.from_pretrained(path, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)


def batch(encoder, sentences=OBJECTIVE_SENTENCES):
    """ids, mask, special as pretrain.step_fn builds them."""
    import torch

    tok = encoder.tokenizer(sentences, padding=True, return_tensors="pt")
    ids, mask = tok["input_ids"], tok["attention_mask"]
    special = torch.isin(ids, torch.tensor(encoder.tokenizer.all_special_ids)) | (mask == 0)
    return ids, mask, special


def random_batch(vocab_size, b=400, t=40, seed=0):
    """Random ids with [CLS]=2 / [SEP]=3 around 1..t-2 real tokens per row, right padding (0)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, t + 1, (b,), generator=g)
    ids = torch.randint(5, vocab_size, (b, t), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    ids[:, 0] = 2
    ids[torch.arange(b), lengths - 1] = 3
    special = (ids == 2) | (ids == 3) | (mask == 0)
    return ids, mask, special


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


# ----------------------------------------------------------------------------- NLI sentences

PREMISES = ["A man plays a guitar on the stage.", "Two dogs run across the green field.",
            "A woman is slicing an onion in the kitchen.", "The children are singing a song near the market."]
ENTAILED = ["A man plays music.", "Animals are running outside.", "Someone is cutting a vegetable.",
            "Kids sing."]
NEUTRAL = ["The man is famous.", "The dogs are brothers.", "The woman cooks for her family.",
           "The song is about summer."]
CONTRADICTED = ["The man is asleep in bed.", "Two cats sleep on the sofa.", "A woman is swimming.",
                "The children are silent."]


def stacked(encoder, columns):
    """ids, mask, special of k columns of b sentences stacked [k b, t], as pretrain's step builds them."""
    import torch

    tok = encoder.tokenizer([s for column in columns for s in column], padding=True, return_tensors="pt")
    ids, mask = tok["input_ids"], tok["attention_mask"]
    return ids, mask, torch.isin(ids, torch.tensor(encoder.tokenizer.all_special_ids)) | (mask == 0)


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


# ----------------------------------------------------------------------------- a SentEval directory

SENTEVAL_WORDS = "man woman dog cat guitar piano music song film book street beach food water car train".split()


def write_lines(path: Path, lines, encoding="utf-8") -> Path:
    """Write ``lines`` (one a line) to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines), encoding=encoding)
    return path


def senteval_sentence(i: int) -> str:
    return (f"a {SENTEVAL_WORDS[i % len(SENTEVAL_WORDS)]}  and the "
            f"{SENTEVAL_WORDS[(3 * i + 1) % len(SENTEVAL_WORDS)]} .")  # two spaces: normalised


def write_sts_year(root: Path, year: str, n: int = 4, offset: int = 0) -> dict[str, list[float]]:
    """Every subset of ``year`` with n + k pairs (k: the subset's index; one pair with an empty
    score), no pair twice (ties in the cosines), plus STS.gs.ALL.txt."""
    from bertcf.data import senteval as se

    write, sentence = write_lines, senteval_sentence
    folder = se.sts_year_dir(root, year)
    scores = {}
    for k, subset in enumerate(se.STS_YEARS[year]):
        m = n + k  # subsets of different sizes, so "mean" and "wmean" differ
        gold = [f"{(i * 1.3 + k) % 5:.2f}" for i in range(m)]
        gold[1] = ""
        write(folder / f"STS.input.{subset}.txt", [f"{sentence(i + offset)} {k}\t{sentence(2 * i + k)}" for i in range(m)])
        write(folder / f"STS.gs.{subset}.txt", gold)
        scores[subset] = [float(g) for g in gold if g]
    write(folder / "STS.gs.ALL.txt", ["garbage", "not a subset"])
    return scores


def write_senteval(root: Path) -> Path:
    """A tiny SentEval directory: every STS and transfer task, a few lines each."""
    from bertcf.data import senteval as se

    write, sentence = write_lines, senteval_sentence
    for j, year in enumerate(se.STS_YEARS):
        write_sts_year(root, year, offset=j)
    for split, n in (("train", 6), ("dev", 6), ("test", 6)):
        write(root / se.STSB_FILES[split], [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{i * 0.8:.3f}\t"
                                            f"{sentence(i)}\t{sentence(i + 1)}" for i in range(n)])
        write(root / se.SICK_FILES[split], ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
              + [f"{i}\t{sentence(i)}\t{sentence(i + 2)}\t{1 + i * 0.7:.1f}\tNEUTRAL" for i in range(n)])
    for task, (pos, neg) in se.BINARY_FILES.items():
        write(root / pos, [f"good {sentence(i)}" for i in range(10)], "latin-1")
        write(root / neg, [f"bad {sentence(i)}" for i in range(10)], "latin-1")
    for split in ("train", "dev", "test"):
        write(root / se.SST2_FILES[split], [f"{'good' if i % 2 else 'bad'} {sentence(i)} \t{i % 2}" for i in range(10)])
    for split in ("train", "test"):
        write(root / se.TREC_FILES[split], [f"{se.TREC_CLASSES[i % 6]}:fine what is {sentence(i)} ?"
                                             for i in range(30)], "latin-1")
        write(root / se.MRPC_FILES[split], ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
              + [f"{i % 2}\t{i}\t{i + 100}\t{sentence(i)}\t{sentence(i if i % 2 else i + 5)}" for i in range(20)],
              "utf-8-sig")
    return root


# ----------------------------------------------------------------------------- sentence-transformers alone

ST_SENTENCES = ["A man is playing a guitar.", "Two dogs run across the park in the morning sun.", "Hello",
                "the quick brown fox jumps over the lazy dog " * 3]

STANDALONE = """
import importlib.abc, json, sys
class NoBertcf(importlib.abc.MetaPathFinder):  # as on a machine where BERT-CF was never installed
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("bertcf", "minbert"):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, NoBertcf())
try:
    import bertcf
    sys.exit("bertcf is importable")
except ImportError:
    pass
from sentence_transformers import SentenceTransformer
sentences, models = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps([SentenceTransformer(path, device="cpu", trust_remote_code=trust).encode(sentences).tolist()
                  for path, trust in models]))
"""


def standalone_vectors(*models) -> list[torch.Tensor]:
    """The vectors sentence-transformers gives for ST_SENTENCES from each (checkpoint,
    trust_remote_code) of ``models``, in a process started outside the repository (-I: no current
    directory or PYTHONPATH on the path) where bertcf cannot be imported."""
    import json
    import subprocess
    import sys
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as elsewhere:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
            "HF_MODULES_CACHE": os.path.join(elsewhere, "hf-modules"), "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, "-I", "-c", STANDALONE, json.dumps(ST_SENTENCES),
                               json.dumps([(str(path), trust) for path, trust in models])],
                              cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.tensor(v) for v in json.loads(proc.stdout.strip().splitlines()[-1])]
