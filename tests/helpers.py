"""What more than one test module uses, besides the fixtures (``conftest.py``): tiny checkpoints,
data files in the real formats, a tiny pretraining run's argv, the objectives' batches, NLI
sentences, a SentEval directory, sentence-transformers in a process without bertcf. A test module
imports them with ``from helpers import ...`` (pytest puts ``tests/`` on ``sys.path``, as it does
for ``conftest.py``). Everything here works offline; torch and bertcf load on first use.

- paths and settings: ``REPO``, ``SHARED``, ``REAL_VOCAB``, ``REAL_BERT_ENV``, ``TINY_BERT_CONFIG``,
  ``TINY_MLM_CONFIG``;
- checkpoints and the hub: ``synthetic_vocab``, ``make_hf_bert_dir``, ``offline_hub_cache`` (a hub
  name served from a fresh local cache, offline);
- CS224N-format data: ``write_cs224n_files``, ``cs224n_sentence``;
- objectives and runs: ``make_objective``, ``record_pretrainings``; ``PRETRAIN_WORDS``,
  ``pretrain_sentence``, ``base_args``, ``run_quiet``, ``exit_status``, ``assert_one_error_line``,
  ``tensors``, ``training_state`` (run_pretrain.py runs); ``OBJECTIVE_SENTENCES``, ``load``,
  ``batch``, ``random_batch`` (objectives on a batch); ``PREMISES``, ``ENTAILED``, ``NEUTRAL``,
  ``CONTRADICTED``, ``stacked`` (NLI columns);
- SentEval files: ``write_senteval``, ``write_sts_year``, ``write_lines``, ``senteval_sentence``;
- sentence-transformers where bertcf is not installed: ``ST_SENTENCES``, ``standalone_vectors``;
- processes: ``run_side_by_side`` (several commands at once, one per core);
- stage 3 runs: ``MULTITASK_SETTINGS``, ``multitask_argv`` (the tests' run_multitask.py argv), ``quiet_multitask``,
  ``refused``.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and bertcf load when a helper first needs them
    import torch

    from bertcf.models.encoder import SentenceEncoder

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
REAL_VOCAB = SHARED / "models" / "bert-base-uncased-vocab" / "vocab.txt"
REAL_BERT_ENV = "BERTCF_REAL_BERT"


def torchrun(script, *argv, nproc: int = 2) -> tuple[list[str], dict]:
    """The command and environment of ``python -m torch.distributed.run --standalone --nproc_per_node N
    SCRIPT ARGV`` on the CPU (gloo), one thread a rank: the tests' data-parallel launches."""
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script),
           *map(str, argv)]
    return cmd, os.environ | {"OMP_NUM_THREADS": "1"}


#: The configuration of ``tiny_bert_dir`` (vocab_size is that of ``vocab_path``).
TINY_BERT_CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.1,
                        pad_token_id=0)


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


def cs224n_sentence(i: int) -> str:
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
        sst = [[i, _id("sst", split, i), _SST[i % len(_SST)] if i % 3 == 0 else " " + cs224n_sentence(i + 7 * len(split)),
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
        sts = [[2000 + i, _id("sts", split, i), cs224n_sentence(i), cs224n_sentence(i if i % 3 else i + 1).replace("the", "a"),
                f"{(i * 0.7) % 5.0:.1f}" if i % 4 else ("5.0" if i % 8 == 0 else "0.0")] for i in range(n)]
        write(f"sts-{split}.csv", ["", "id", "sentence1", "sentence2", "similarity"], sts)
    # Test files have no label column; the SST one has the real file's shifted header.
    write("ids-sst-test-student.csv", ["0", "", "id", "sentence"],
          [[i + 1, f"{float(i)}", _id("sst", "test", i), " " + cs224n_sentence(i + 3)] for i in range(n_test)])
    write("quora-test-student.csv", ["", "id", "sentence1", "sentence2"],
          [[3000 + i, _id("quora", "test", i), _question(i), _question(i + 1)] for i in range(n_test)])
    write("sts-test-student.csv", ["", "id", "sentence1", "sentence2"],
          [[4000 + i, _id("sts", "test", i), cs224n_sentence(i + 2), cs224n_sentence(i + 5)] for i in range(n_test)])
    return directory


# ----------------------------------------------------------------------------- objectives and the experiments' runs

def make_objective(stage: str, method: str, encoder, generator=None, examples=None, **settings):
    """The objective of ``--stage``/``--method`` on ``encoder``, built as ``run_pretrain.py`` builds
    it: ``settings`` are its keyword settings (those of other objectives are left out, as a run's
    flags are; ``pooling="cls-mlp"`` gives SimCSE's MLP), ``examples`` size a supervised head."""
    from bertcf.objectives import objective_class

    cls = objective_class(stage, method)
    run = {"mlp": settings.pop("pooling", None) == "cls-mlp"} | {k: settings.pop(k) for k in ("max_length", "checkpoint")
                                                                if k in settings}
    if run["mlp"]:
        encoder.pooling = "cls"  # as the command builds the encoder for SimCSE's MLP over [CLS]
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

    def recording(task):
        if task.kind == "pretraining":
            calls.append(task.argv + (["--resume"] if task.state == "resume" else []))
            if not run:
                return {}
        return real(task)
    monkeypatch.setattr(execute, "run_planned", recording)
    return calls


# ----------------------------------------------------------------------------- pretraining runs

#: The words of ``data_dir``'s sentences.
PRETRAIN_WORDS = ("the a man woman dog cat child band girl boy plays runs eats sits walks reads sings cooks "
                  "on in under near with across park street house table garden ball guitar piano book song "
                  "red blue small big happy old young two three black white grass water car bike quickly "
                  "slowly morning evening city river beach stage music food").split()


def pretrain_sentence(rng, n: int) -> str:
    return " ".join(rng.choice(PRETRAIN_WORDS) for _ in range(n))


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


def padded_ids(seed=0, lengths=(9, 5, 2), vocab=100):
    """Random ids of rows of these ``lengths``, right-padded with 0, and their attention mask."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


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

#: The process that ``standalone_vectors`` asks: sentence-transformers imported once (7 s of a 2-core machine's time)
#: where bertcf cannot be imported, then each request (a line: [sentences, [[path, trust_remote_code], ...]]) in a
#: fork of it as it is then, no model nor remote code loaded yet; a line of vectors back, or null if the fork failed.
STANDALONE = """
import importlib.abc, json, os, sys, traceback
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
for request in sys.stdin:
    child = os.fork()
    if child == 0:
        try:
            sentences, models = json.loads(request)
            vectors = [SentenceTransformer(path, device="cpu", trust_remote_code=trust).encode(sentences).tolist()
                       for path, trust in models]
            print(json.dumps(vectors), flush=True)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    if os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) != 0:
        print("null", flush=True)
"""
_standalone: dict = {}  # the STANDALONE process of this test session, started on first use


def _standalone_process():
    """STANDALONE started outside the repository (-I: no current directory or PYTHONPATH on the path; a fresh
    HF_MODULES_CACHE), offline, once a session; ended when the session's process exits."""
    import atexit
    import contextlib
    import shutil
    import subprocess
    import sys
    import tempfile

    if "proc" not in _standalone:
        elsewhere = tempfile.mkdtemp(prefix="bertcf-standalone-")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
            "HF_MODULES_CACHE": os.path.join(elsewhere, "hf-modules"), "HF_HUB_OFFLINE": "1"}
        stderr = open(os.path.join(elsewhere, "stderr.txt"), "w+")
        proc = subprocess.Popen([sys.executable, "-I", "-c", STANDALONE], cwd=elsewhere, env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)

        def stop():
            with contextlib.suppress(OSError):  # a process that died has closed its end
                proc.stdin.close()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            stderr.close()
            shutil.rmtree(elsewhere, ignore_errors=True)
        atexit.register(stop)
        _standalone.update(proc=proc, stderr=stderr)
    return _standalone["proc"], _standalone["stderr"]


def standalone_vectors(*models) -> list[torch.Tensor]:
    """The vectors sentence-transformers gives for ST_SENTENCES from each (checkpoint,
    trust_remote_code) of ``models``, in a process started outside the repository (-I: no current
    directory or PYTHONPATH on the path) where bertcf cannot be imported: a fork of the session's
    STANDALONE process, which imported sentence-transformers once."""
    import json
    import select

    import torch

    proc, stderr = _standalone_process()
    try:
        proc.stdin.write(json.dumps([ST_SENTENCES, [(str(path), trust) for path, trust in models]]) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline() if select.select([proc.stdout], [], [], 300)[0] else ""
    except BrokenPipeError:
        line = ""
    stderr.seek(0)
    assert line.strip() not in ("", "null"), stderr.read()[-3000:] or f"exit status {proc.poll()}"
    return [torch.tensor(v) for v in json.loads(line)]


# ----------------------------------------------------------------------------- processes

def run_side_by_side(commands: dict, timeout: float = 300, **kwargs) -> dict:
    """name -> argv, each run to its end, as many at a time as there are cores (most of a command a test
    starts is a single-threaded Python start and import, which one at a time leaves the other cores idle):
    name -> its ``subprocess.CompletedProcess`` (text; stdout and stderr captured). ``kwargs``: cwd, env, ..."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        started = {name: pool.submit(subprocess.run, argv, capture_output=True, text=True, timeout=timeout, **kwargs)
                   for name, argv in commands.items()}
    return {name: future.result() for name, future in started.items()}


# ----------------------------------------------------------------------------- stage 3 runs

#: What ``multitask_argv`` gives run_multitask.py after --encoder, --data-dir, --out-dir and --steps: a tiny
#: CPU run (small batches and heads, the first 10 training rows), in this order. A value as it is written
#: on the command line: "1e-3", not 1e-3, which str() writes 0.001.
MULTITASK_SETTINGS = {"eval-every": 2, "log-every": 1, "sst-batch-size": 4, "qqp-batch-size": 6, "sts-batch-size": 4,
                      "proj-dim": 16, "max-length": 24, "lr": "1e-3", "device": "cpu", "precision": "fp32",
                      "max-train-examples": 10}


def multitask_argv(bert_dir, data_dir, out_dir, steps, *extra, **flags) -> list[str]:
    """run_multitask.py's argv for a tiny CPU run of the report's three tasks on ``data_dir``
    (write_cs224n_files): ``bert_dir`` as --encoder (None: no --encoder), then MULTITASK_SETTINGS,
    then ``extra`` as given (str() of each). ``flags`` change a setting where it stands or add one
    after them: ``proj_dim=8`` is --proj-dim 8, True a bare flag, None or False leaves the option out
    (``log_every=None``: no --log-every). The tests build their stage-3 runs' argv here."""
    settings = {"encoder": bert_dir, "data-dir": data_dir, "out-dir": out_dir, "steps": steps, **MULTITASK_SETTINGS}
    settings |= {k.replace("_", "-"): v for k, v in flags.items()}
    argv = []
    for k, v in settings.items():
        if v is None or v is False:
            continue
        argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return argv + [str(a) for a in extra]


def quiet_multitask(argv) -> dict:
    """run_multitask.py's run of ``argv``, its summary lines captured."""
    import contextlib
    import io

    from bertcf.multitask import command

    with contextlib.redirect_stdout(io.StringIO()):
        return command.run(argv)


def refused(argv, capsys, *needles) -> str:
    """Run stage 3's command on ``argv``: exit status 2 and one line on stderr, no traceback, holding
    each of ``needles``; returns the line."""
    from bertcf.cli import run_main
    from bertcf.multitask import command
    capsys.readouterr()
    try:
        status = run_main(command.run, [str(a) for a in argv])
    except SystemExit as e:  # argparse's own refusals
        status = e.code
    captured = capsys.readouterr()
    assert status == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
