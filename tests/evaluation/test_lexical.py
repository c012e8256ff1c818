"""Mirror-BERT's lexical half (issue 36): word lists as a pretraining corpus (--corpus-words,
--corpus-words-file), the mirror-bert-lexical preset, the word-similarity readers, the evaluator
(against a Spearman computed by hand, ties included), ``evaluate --tasks lexical`` (against word
vectors from ``transformers``), and the experiments' lexical command."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import wordfreq
from helpers import base_args, run_quiet, write_senteval
from scipy import stats

from bertcf import SentenceEncoder, cli
from bertcf.cli import run_main
from bertcf.commands import pretrain
from bertcf.config import pretrain as pretrain_config
from bertcf.config.pretrain import PretrainConfig
from bertcf.data.words import WordPair, read_word_list, read_word_pairs, top_words, word_similarity_files
from bertcf.errors import DataError, UsageError
from bertcf.commands.evaluate import main as evaluate_cli
from bertcf.evaluation.lexical import WordSimilarityEvaluator, evaluate_words
from bertcf.evaluation.senteval import evaluate, format_table

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: one intra-op thread

SIMLEX_HEADER = "word1\tword2\tPOS\tSimLex999\tconc(w1)\tconc(w2)\tconcQ\tAssoc(USF)\tSimAssoc333\tSD(SimLex)"
#: Six pairs with ties: in the gold scores (7.5 twice, 3.0 twice) and in the cosines (a pair and
#: its reverse; red/blue and sun/moon have the same vectors, below).
PAIRS = [("cat", "dog", 7.5), ("dog", "cat", 7.5), ("car", "bus", 6.0), ("red", "blue", 3.0), ("sun", "moon", 3.0),
         ("cat", "car", 1.0), ("bus", "moon", 4.0)]
VECTORS = {"cat": [1.0, 0.2, 0.0], "dog": [0.9, 0.4, 0.1], "car": [0.0, 1.0, 0.3], "bus": [0.1, 0.8, 0.5],
           "red": [0.5, 0.5, 0.5], "blue": [0.2, 0.9, -0.3], "sun": [0.5, 0.5, 0.5], "moon": [0.2, 0.9, -0.3]}


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def simlex_file(path: Path, pairs=PAIRS) -> Path:
    """SimLex-999's layout: its header, then word1, word2, POS, score and six more columns."""
    return write(path, [SIMLEX_HEADER] + [f"{a}\t{b}\tN\t{s}\t4.1\t4.5\t3\t0.1\t0\t1.2" for a, b, s in pairs])


def by_hand_spearman(cosines, gold) -> float:
    """Spearman's rho as the Pearson r of the tie-averaged ranks (scipy's rankdata)."""
    x, y = stats.rankdata(cosines), stats.rankdata(gold)
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum()))


# ---- readers ---------------------------------------------------------------------------------------------
def test_word_pair_layouts_agree(tmp_path):
    expected = [WordPair(a, b, s) for a, b, s in PAIRS]
    assert read_word_pairs(simlex_file(tmp_path / "simlex.txt")) == expected
    plain = [f"{a}\t{b}\t{s}" for a, b, s in PAIRS]
    assert read_word_pairs(write(tmp_path / "plain.txt", plain)) == expected
    assert read_word_pairs(write(tmp_path / "header.tsv", ["w1\tw2\tscore"] + plain)) == expected
    assert read_word_pairs(write(tmp_path / "spaces.txt", [l.replace("\t", " ") for l in plain])) == expected
    assert read_word_pairs(write(tmp_path / "blank.txt", plain[:3] + [""] + plain[3:] + [""])) == expected
    # the real file: 999 pairs, its first and last rows as SOURCES.md lists them
    real = Path(__file__).resolve().parents[3] / "shared" / "data" / "lexical" / "SimLex-999.txt"
    if real.is_file():
        pairs = read_word_pairs(real)
        assert len(pairs) == 999 and pairs[0] == WordPair("old", "new", 1.58)
        assert pairs[-1] == WordPair("attend", "arrive", 6.08)


@pytest.mark.parametrize("lines, message", [
    (["cat\tdog\t7", "car\tbus\tfast"], "bad.txt line 2: score 'fast' is not a finite number"),
    ([SIMLEX_HEADER, "cat\tdog\tN\t7", "car\tbus\tN"], "bad.txt line 3: 3 field(s), expected word1, word2 and a "
                                                         "score in field 4"),
    (["cat\tdog\t7", "cat\t\t2"], "bad.txt line 2: an empty word"),
    (["cat\tdog\t7", "car\tbus\tnan"], "bad.txt line 2: score 'nan' is not a finite number"),
    ([], "is empty"),
    (["w1\tw2\tscore"], "has a header but no pairs"),
])
def test_malformed_word_pairs_name_file_and_line(tmp_path, lines, message):
    with pytest.raises(DataError, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")):
        read_word_pairs(write(tmp_path / "bad.txt", lines))


def test_word_similarity_files_are_the_txt_and_tsv_files(tmp_path):
    simlex_file(tmp_path / "SimLex-999.txt")
    write(tmp_path / "men.tsv", ["a\tb\t1"])
    write(tmp_path / "SOURCES.md", ["# not a task"])
    write(tmp_path / ".hidden.txt", ["x"])
    assert list(word_similarity_files(tmp_path)) == ["SimLex-999", "men"]
    with pytest.raises(DataError, match="is not a directory"):
        word_similarity_files(tmp_path / "nope")
    with pytest.raises(DataError, match="has no word-similarity file"):
        word_similarity_files(write(tmp_path / "empty" / "README.md", ["x"]).parent)


def test_word_lists(tmp_path):
    path = write(tmp_path / "words.txt", ["  dog ", "", "ice  cream", "dog", "new york city", "\t"])
    assert read_word_list(path) == ["dog", "ice cream", "new york city"]  # phrases kept, repeats once
    for bad, message in ((write(tmp_path / "empty.txt", ["", "  "]), "is empty"),
                         (tmp_path / "missing.txt", "not found"), (tmp_path, "is a directory")):
        with pytest.raises(DataError, match=message):
            read_word_list(bad)
    (tmp_path / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="is not valid UTF-8"):
        read_word_list(tmp_path / "latin.txt")
    words, source = top_words(50)
    assert words == wordfreq.top_n_list("en", 50) and source.startswith("wordfreq ")


# ---- the evaluator ---------------------------------------------------------------------------------------
def embed_fixed(words) -> torch.Tensor:
    return torch.tensor([VECTORS[w] for w in words])


def test_spearman_by_hand_with_ties(tmp_path):
    evaluator = WordSimilarityEvaluator("SimLex-999", read_word_pairs(simlex_file(tmp_path / "s.txt")))
    result = evaluator(embed_fixed)
    a, b = (np.array([VECTORS[p[i]] for p in PAIRS]) for i in (0, 1))
    cosines = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    gold = [s for _, _, s in PAIRS]
    assert len(set(np.round(cosines, 12))) == len(PAIRS) - 2  # two ties among the cosines, two in gold
    assert result["spearman"] == pytest.approx(100 * by_hand_spearman(cosines, gold), abs=1e-9)
    assert result["spearman"] == pytest.approx(100 * stats.spearmanr(cosines, gold).statistic, abs=1e-9)
    assert result["pairs"]["scores"] == pytest.approx(cosines.tolist(), abs=1e-6)  # float32 vectors
    lo, hi = result["ci95"]
    assert lo <= result["spearman"] <= hi and result["n"] == len(PAIRS)
    assert len(result["replicates"]) == 1000


class StubEncoder:
    """An encoder whose word vectors are VECTORS ([CLS]) or their negation's reverse (mean): what
    evaluate_words asks it to encode, and with which pooling, is recorded."""

    def __init__(self, pooling="mean", flow=None):
        self.pooling, self.flow, self.calls = pooling, flow, []

    def encode(self, words, **kwargs):
        self.calls.append((self.pooling, list(words)))
        vectors = embed_fixed(words)
        return vectors if self.pooling == "cls" else vectors.flip(-1) ** 2


def test_each_word_encoded_once_with_the_pooling_asked_for(tmp_path):
    simlex_file(tmp_path / "a.txt")
    simlex_file(tmp_path / "b.txt", PAIRS[:4])
    encoder = StubEncoder("mean")
    own = evaluate_words(encoder, tmp_path, pair_scores=True)
    assert len(encoder.calls) == 1 and encoder.calls[0][0] == "mean"
    words = encoder.calls[0][1]
    assert len(words) == len(set(words)) == len(VECTORS)
    cls = evaluate_words(encoder, tmp_path, "cls")
    assert encoder.calls[1][0] == "cls" and encoder.pooling == "mean"  # the override is undone
    assert cls["lexical"]["a"] == pytest.approx(WordSimilarityEvaluator("a", read_word_pairs(tmp_path / "a.txt"))(
        embed_fixed)["spearman"])
    assert own["lexical"]["a"] != pytest.approx(cls["lexical"]["a"])
    assert set(own["lexical_detail"]["b"]) == {"spearman", "n", "ci95", "pooling"}
    assert own["lexical_detail"]["b"]["pooling"] == "mean" and set(own["lexical_pairs"]) == {"a", "b"}
    with pytest.raises(UsageError, match="flow was fitted to its mean pooling"):
        evaluate_words(StubEncoder("mean", flow=object()), tmp_path, "cls")


# ---- the command -----------------------------------------------------------------------------------------
def transformers_word_vectors(bert_dir, words, pooling) -> np.ndarray:
    """Each word alone through transformers' BertModel: [CLS] of the last layer, or its mean over the tokens."""
    import transformers
    model = transformers.BertModel.from_pretrained(str(bert_dir)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(bert_dir))
    out = []
    with torch.no_grad():
        for w in words:
            hidden = model(**tokenizer(w, return_tensors="pt")).last_hidden_state[0]
            out.append((hidden[0] if pooling == "cls" else hidden.mean(0)).numpy())
    return np.array(out, dtype=np.float64)


def expected_spearman(bert_dir, pairs, pooling) -> float:
    a, b = (transformers_word_vectors(bert_dir, [p[i] for p in pairs], pooling) for i in (0, 1))
    cosines = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return 100 * stats.spearmanr(cosines, [p[2] for p in pairs]).statistic


def test_cli_lexical_follows_the_encoders_pooling(tmp_path, tiny_bert_dir, capsys):
    # Without the reversed pair: its cosine ties (cat, dog)'s exactly in one implementation and to
    # the last bit or not in the other, depending on the CPU's kernels, and a broken tie moves rho.
    pairs = [p for p in PAIRS if p[:2] != ("dog", "cat")]
    lexical = tmp_path / "lexical"
    simlex_file(lexical / "SimLex-999.txt", pairs)
    out = tmp_path / "r.json"
    argv = ["--encoder", str(tiny_bert_dir), "--tasks", "lexical", "--lexical-dir", str(lexical), "--json", str(out),
            "--no-progress", "--device", "cpu"]
    assert evaluate_cli(argv) == 0
    result = json.loads(out.read_text())
    assert result["lexical_detail"]["SimLex-999"]["pooling"] == "mean"  # an HF BERT directory pools by mean
    assert result["lexical"]["SimLex-999"] == pytest.approx(expected_spearman(tiny_bert_dir, pairs, "mean"), abs=1e-4)
    assert result["sts"] == {} and result["transfer"] == {}
    printed = capsys.readouterr().out
    assert "Word similarity: Spearman ×100 of the cosine, mean pooling" in printed
    assert f"{result['lexical']['SimLex-999']:.2f} |" in printed
    assert evaluate_cli(argv + ["--lexical-pooling", "cls"]) == 0
    cls = json.loads(out.read_text())
    assert cls["lexical"]["SimLex-999"] == pytest.approx(expected_spearman(tiny_bert_dir, pairs, "cls"), abs=1e-4)
    # a checkpoint that pools by [CLS] is scored with [CLS] without being told
    checkpoint = tmp_path / "cls-checkpoint"
    SentenceEncoder.from_pretrained(tiny_bert_dir, pooling="cls").save_pretrained(checkpoint)
    assert evaluate_cli(argv[:1] + [str(checkpoint)] + argv[2:]) == 0
    assert json.loads(out.read_text())["lexical"] == pytest.approx(cls["lexical"])


def test_sts_and_lexical_together(tmp_path, tiny_bert_dir):
    root = write_senteval(tmp_path / "SentEval")
    lexical = tmp_path / "lexical"
    simlex_file(lexical / "SimLex-999.txt")
    write(lexical / "mine.tsv", [f"{a}\t{b}\t{s}" for a, b, s in PAIRS[2:]])
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    both = evaluate(encoder, root, "STSBenchmark,lexical", lexical_dir=lexical, pair_scores=True)
    alone = evaluate(encoder, root, "STSBenchmark")
    assert both["sts"] == alone["sts"] and list(both["lexical"]) == ["SimLex-999", "mine"]
    assert set(both["lexical_pairs"]) == {"SimLex-999", "mine"} and "sts_pairs" in both
    lines = format_table(both).splitlines()
    assert "STSBenchmark" in lines[1]  # the STS table first
    at = lines.index("Word similarity: Spearman ×100 of the cosine, mean pooling")
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[at + 2:at + 6:2] + lines[at + 5:at + 6]]
    assert cells[0] == ["SimLex-999", "mine"]  # no average column
    assert cells[1] == [f"{both['lexical'][t]:.2f}" for t in ("SimLex-999", "mine")]
    assert cells[2] == ["[{:.2f}, {:.2f}]".format(*both["lexical_detail"][t]["ci95"]) for t in ("SimLex-999", "mine")]


@pytest.mark.parametrize("files, args, message", [
    ({"bad.txt": ["cat\tdog\t7", "car\tbus\t6", "red\tblue\tx"]}, [], "bad.txt line 3: score 'x' is not a finite"),
    ({"empty.txt": []}, [], "empty.txt is empty"),
    ({}, [], "has no word-similarity file"),
    ({"ok.txt": ["cat\tdog\t7"]}, ["--mode", "dev"], "--mode dev: the word-similarity sets have no dev split"),
    ({"ok.txt": ["cat\tdog\t7"]}, ["--lexical-pooling", "max"], "argument --lexical-pooling: invalid choice"),
    ({"ok.txt": ["cat\tdog\t7"]}, ["--tasks", "lexical,nope"], "unknown task 'nope' (sts, transfer, lexical"),
])
def test_bad_lexical_input_is_one_line_and_status_2(tmp_path, tiny_bert_dir, capsys, files, args, message):
    lexical = tmp_path / "lexical"
    lexical.mkdir()
    for name, lines in files.items():
        (lexical / name).write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "r.json"
    argv = ["--encoder", str(tiny_bert_dir), "--tasks", "lexical", "--lexical-dir", str(lexical), "--json", str(out),
            "--no-progress", "--device", "cpu", *args]
    try:
        status = evaluate_cli(argv)
    except SystemExit as e:  # argparse's error()
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_lexical_in_dev_mode_is_refused_before_the_model_loads(tmp_path, capsys):
    lexical = tmp_path / "lexical"
    lexical.mkdir()
    (lexical / "ok.txt").write_text("cat\tdog\t7\n")
    argv = ["--encoder", str(tmp_path / "no-such-model"), "--tasks", "lexical", "--lexical-dir", str(lexical),
            "--mode", "dev", "--no-progress"]
    assert evaluate_cli(argv) == 2
    assert "--mode dev: the word-similarity sets have no dev split" in capsys.readouterr().err


def test_the_suite_scores_a_linear_head_with_its_own_pooling_only(tiny_bert_dir, tmp_path):
    """A whitening (a linear head) was fitted to the encoder's pooling, as a flow: the experiments'
    word scoring asks for that one alone rather than stopping at the other."""
    from bertcf.experiments.results import word_similarity

    lexical = tmp_path / "lexical"
    lexical.mkdir()
    (lexical / "ok.txt").write_text("cat\tdog\t7\ncar\tbus\t6\nred\tblue\t5\n")
    encoder = SentenceEncoder.from_pretrained(tiny_bert_dir)
    assert set(word_similarity(encoder, lexical)) == {"pooling", "cls", "mean"}
    encoder.dense = torch.nn.Linear(encoder.dim, 8)
    scored = word_similarity(encoder, lexical)
    assert scored["pooling"] == "mean" and set(scored) == {"pooling", "mean"}


# ---- pretraining on words --------------------------------------------------------------------------------
WORD_LIST = ["dog", "cat", "ice cream", "guitar", "river", "happy", "slowly", "new york", "music", "table"]


def test_pretraining_on_a_word_list(tiny_bert_dir, data_dir, tmp_path, capsys):
    words = write(tmp_path / "words.txt", WORD_LIST + ["dog"])
    out = tmp_path / "run"
    argv = base_args(tiny_bert_dir, data_dir, out, steps=3, corpus=None, eval_every=3) + [
        "--corpus-words-file", str(words)]
    summary, _ = run_quiet(argv)
    assert summary["step"] == 3
    config = json.loads((out / "config.json").read_text())
    assert config["corpus_words_file"] == str(words) and config["word_list"] == str(words)
    assert f"note: corpus: {len(WORD_LIST)} words or phrases from {words}" in capsys.readouterr().err
    out = tmp_path / "top"
    run_quiet(base_args(tiny_bert_dir, data_dir, out, steps=1, corpus=None) + ["--corpus-words", "40"])
    config = json.loads((out / "config.json").read_text())
    assert config["corpus_words"] == 40 and config["word_list"].startswith("wordfreq ")


@pytest.mark.parametrize("flags, message", [
    (["--corpus", "WORDS", "--corpus-words-file", "WORDS"], "give one corpus, not --corpus and --corpus-words-file "
                                                            "together"),
    (["--corpus-words", "1"], "argument --corpus-words: must be at least 2, not 1"),
    (["--corpus-words-file", "EMPTY"], "empty.txt is empty"),
    (["--corpus-words-file", "MISSING"], "missing.txt not found"),
])
def test_bad_word_corpus_is_one_line_and_status_2(tiny_bert_dir, data_dir, tmp_path, capsys, flags, message):
    files = {"WORDS": write(tmp_path / "words.txt", WORD_LIST), "EMPTY": write(tmp_path / "empty.txt", [""]),
             "MISSING": tmp_path / "missing.txt"}
    argv = base_args(tiny_bert_dir, data_dir, tmp_path / "run", corpus=None) + [str(files.get(f, f)) for f in flags]
    try:
        status = run_main(pretrain.run, argv)
    except SystemExit as e:
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and not any("Traceback" in line for line in err)


def preset_args(argv: list[str]) -> PretrainConfig:
    """The settings of ``argv`` with what its --preset sets (``config.pretrain.preset_values``)."""
    parser = pretrain_config.build_parser()
    config = PretrainConfig(**vars(parser.parse_args(argv)))
    return config.replace(**pretrain_config.preset_values(config, cli.given_flags(parser, argv)))


def test_the_lexical_preset_is_the_papers_word_recipe(tiny_bert_dir, data_dir, tmp_path, capsys):
    args = preset_args(["--preset", "mirror-bert-lexical"])
    assert (args.corpus_words, args.temperature, args.pooling, args.span_cap, args.negatives) == (
        10_000, 0.2, "cls", 0, "ntxent")
    assert (args.batch_size, args.lr, args.max_length, args.dropout, args.select_on, args.method) == (
        200, 2e-5, 25, 0.1, "last", "mirror")
    assert args.preset_epochs == 2
    # any corpus on the command line replaces the preset's word list
    assert preset_args(["--preset", "mirror-bert-lexical", "--corpus", "c.txt"]).corpus_words is None
    assert preset_args(["--preset", "mirror-bert-lexical", "--corpus-words", "50"]).corpus_words == 50
    capsys.readouterr()
    words = write(tmp_path / "words.txt", WORD_LIST)
    out = tmp_path / "lexical"
    argv = [a for a in base_args(tiny_bert_dir, data_dir, out, corpus=None) if a not in ("--steps", "6")]
    summary, printed = run_quiet(argv + ["--preset", "mirror-bert-lexical", "--corpus-words-file", str(words)])
    config = json.loads((out / "config.json").read_text())
    assert config["steps"] == math.ceil(2 * len(WORD_LIST) / 4) == summary["step"]  # 2 epochs of batch 4
    assert config["batch_size"] == 4 and "corpus_words" not in config["preset_values"]
    assert (config["temperature"], config["pooling"], config["select_on"]) == (0.2, "cls", "last")
    # the run's end is best/, whatever STS dev says (eval every 3 steps and at the end)
    assert summary["best_step"] == summary["step"]
    assert f"best checkpoint (the last evaluation, step {summary['step']}): {out / 'best'}" in printed
    assert SentenceEncoder.from_pretrained(out / "best").pooling == "cls"
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 3, summary["step"]]


# ---- the experiments' lexical command -----------------------------------------------------------------------
def lexical_argv(bert, data, out, lexical, words, *more) -> list[str]:
    return ["lexical", "--model", str(bert), "--data-dir", str(data), "--out-dir", str(out), "--lexical-dir",
            str(lexical), "--pretrain-args", f"--batch-size 4 --lr 1e-3 --log-every 1 --corpus-words-file {words}",
            "--device", "cpu", "--seed", "3", *more]


def test_lexical_command_plan(tiny_bert_dir, tmp_path, capsys):
    from helpers import write_cs224n_files

    from bertcf.commands import experiments
    data = write_cs224n_files(tmp_path / "data")
    simlex_file(tmp_path / "lexical" / "SimLex-999.txt")
    argv = lexical_argv(tiny_bert_dir, data, tmp_path / "out", tmp_path / "lexical", tmp_path / "w.txt")
    summary = experiments.run(argv + ["--seeds", "3,4", "--dry-run"])
    assert [t["label"] for t in summary["tasks"]] == ["Mirror-BERT (lexical) [seed 3]", "Mirror-BERT (lexical) [seed 4]"]
    command = summary["tasks"][1]["command"].split()
    assert "--preset" in command and command[command.index("--preset") + 1] == "mirror-bert-lexical"
    assert not {"--corpus", "--corpus-from-tasks", "--steps", "--max-length"} & set(command)  # the preset's words
    assert "seeds/4/stages/mirror-lexical" in summary["tasks"][1]["command"] and summary["problems"] == []
    assert not (tmp_path / "out").exists()
    assert experiments.main(argv[:argv.index("--lexical-dir")] + argv[argv.index("--lexical-dir") + 2:]) == 2
    assert "lexical needs --lexical-dir DIR" in capsys.readouterr().err
    assert experiments.main(argv[:argv.index("--lexical-dir") + 1] + [str(tmp_path)] + argv[argv.index(
        "--lexical-dir") + 2:]) == 2
    assert "has no word-similarity file" in capsys.readouterr().err


@pytest.mark.slow
def test_lexical_command_trains_scores_and_tests_the_claim(tiny_bert_dir, tmp_path, capsys):
    """Two seeds of the lexical encoder from the tiny BERT, each scored on a SimLex-layout file with
    both poolings; lexical.md/json set them beside the base and test the claim; a second call reruns
    nothing; the objectives table then has the SimLex column."""
    from helpers import write_cs224n_files

    from bertcf.commands import experiments
    from bertcf.evaluation import bootstrap
    data = write_cs224n_files(tmp_path / "data")
    lexical = tmp_path / "lexical"
    simlex_file(lexical / "SimLex-999.txt")
    words = write(tmp_path / "words.txt", WORD_LIST)
    out = tmp_path / "out"
    argv = lexical_argv(tiny_bert_dir, data, out, lexical, words, "--seeds", "3,4")
    experiments.run(argv)
    config = json.loads((out / "seeds" / "4" / "stages" / "mirror-lexical" / "config.json").read_text())
    assert (config["preset"], config["corpus_words_file"], config["steps"], config["seed"]) == (
        "mirror-bert-lexical", str(words), math.ceil(2 * len(WORD_LIST) / 4), 4)
    result = json.loads((out / "lexical.json").read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["MinBERT", "Mirror-BERT (lexical)"]
    base = {p: evaluate_words(SentenceEncoder.from_pretrained(tiny_bert_dir), lexical, p, pair_scores=True)
            for p in ("cls", "mean")}
    trained = {s: {p: evaluate_words(SentenceEncoder.from_pretrained(d / "stages" / "mirror-lexical" / "best"),
                                     lexical, p, pair_scores=True) for p in ("cls", "mean")}
               for s, d in (("3", out), ("4", out / "seeds" / "4"))}
    for p in ("cls", "mean"):
        assert rows["MinBERT"]["ours"]["lexical"][p]["SimLex-999"]["mean"] == pytest.approx(
            base[p]["lexical"]["SimLex-999"])
        per_seed = rows["Mirror-BERT (lexical)"]["ours"]["lexical"][p]["SimLex-999"]["per_seed"]
        assert per_seed == pytest.approx({s: trained[s][p]["lexical"]["SimLex-999"] for s in ("3", "4")})
    assert trained["3"]["cls"]["lexical_pairs"] != base["cls"]["lexical_pairs"]  # it trained (lr 1e-3)
    claims = {c["metric"]: c for c in result["claims"]}
    assert {"sts_spearman", "lexical_SimLex-999_cls", "lexical_SimLex-999_mean"} <= set(claims)
    claim = claims["lexical_SimLex-999_cls"]
    expected = bootstrap.paired_difference(
        [trained[s]["cls"]["lexical_pairs"]["SimLex-999"]["scores"] for s in ("3", "4")],
        [base["cls"]["lexical_pairs"]["SimLex-999"]["scores"]] * 2, [s for _, _, s in PAIRS], "spearman",
        resamples=2000, seed=0)
    assert claim["mean_difference"] == pytest.approx(100 * expected["mean_difference"])
    assert claim["ci95"] == pytest.approx([100 * v for v in expected["ci95"]]) and claim["verdict"] == \
        expected["verdict"]
    md = (out / "lexical.md").read_text()
    assert "| MinBERT |" in md and "| 10.5 / 26.7 |" in md and "| 55.6 / – |" in md
    assert "SimLex-999 ρ×100 ([CLS])" in md
    assert "Mirror-BERT (lexical) > MinBERT" in (out / "claims.md").read_text()
    capsys.readouterr()
    experiments.run(argv)
    assert capsys.readouterr().out.count("finished earlier, reused") == 2
    experiments.run(["objectives", "--out-dir", str(out), "--rows", "MinBERT-TSDAE", "--steps-scale", "0.0002",
                      "--max-length", "24", "--corpus-from-tasks", "--pretrain-args", "--batch-size 4"])
    objectives = (out / "objectives.md").read_text()
    assert "| SimLex-999 ρ×100 |" in objectives and " (mean) |" in objectives
