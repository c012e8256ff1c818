"""Hard-negative mining (bertcf.data.negatives, python -m bertcf.data mine-negatives): on the same
vectors, the negatives sentence-transformers' mine_hard_negatives picks, for each of its controls
(its exact search in chunks: tests/utils/test_topk.py); the triplets file read back by supervised SimCSE; bad
input in one line."""
from __future__ import annotations

import pytest
import torch

from bertcf.commands.data import main as data_main
from bertcf.data import negatives
from bertcf.data.negatives import Mining, mine
from bertcf.errors import DataError, UsageError

datasets = pytest.importorskip("datasets", reason="sentence-transformers' mine_hard_negatives needs datasets "
                                                  "(the test extra installs it)")


def toy(n_queries=24, n_docs=50, dim=16, seed=0):
    """Queries, each with one positive (some with two; some queries repeated), a corpus, and a
    random unit vector for every text."""
    g = torch.Generator().manual_seed(seed)
    docs = [f"document {i}" for i in range(n_docs)]
    queries, positives = [], []
    for i in range(n_queries):
        queries.append(f"query {i}")
        positives.append(docs[(3 * i) % n_docs])
        if i % 5 == 0:  # a second positive of the same query
            queries.append(f"query {i}")
            positives.append(docs[(3 * i + 1) % n_docs])
    texts = list(dict.fromkeys(queries + docs))
    table = dict(zip(texts, torch.nn.functional.normalize(torch.randn(len(texts), dim, generator=g), dim=-1)))
    for q, p in zip(queries, positives):  # positives near their queries, as real pairs are
        table[p] = torch.nn.functional.normalize(table[q] + 0.3 * table[p], dim=-1)
    return queries, positives, docs, table


class Precomputed:
    """A stand-in for a SentenceTransformer whose vectors are given."""

    device = torch.device("cpu")

    def __init__(self, table):
        self.table = table

    def encode_document(self, texts, **kwargs):
        return torch.stack([self.table[t] for t in texts]).numpy()

    encode_query = encode_document

    def similarity(self, a, b):
        from sentence_transformers import util
        return util.cos_sim(a, b)

    def similarity_pairwise(self, a, b):
        from sentence_transformers import util
        return util.pairwise_cos_sim(a, b)


CONTROLS = [dict(), dict(num_negatives=2), dict(range_min=2, range_max=12), dict(max_score=0.3),
            dict(min_score=-0.1, num_negatives=4), dict(absolute_margin=0.05), dict(relative_margin=0.2),
            dict(range_min=1, absolute_margin=0.0, max_score=0.5, num_negatives=2)]


@pytest.mark.parametrize("controls", CONTROLS, ids=[",".join(c) or "defaults" for c in CONTROLS])
def test_the_negatives_are_mine_hard_negatives(controls):
    from sentence_transformers.util import mine_hard_negatives

    queries, positives, docs, table = toy()
    theirs = mine_hard_negatives(datasets.Dataset.from_dict({"query": queries, "positive": positives}),
                                 Precomputed(table), corpus=docs, verbose=False, output_format="triplet",
                                 **controls)
    ours = mine(queries, positives, docs, lambda texts: torch.stack([table[t] for t in texts]),
                Mining(**controls, chunk_size=7))
    assert ours == list(zip(theirs["query"], theirs["positive"], theirs["negative"]))
    assert ours  # the controls leave some


def test_random_sampling_draws_valid_negatives_reproducibly():
    queries, positives, docs, table = toy()

    def embed(texts):
        return torch.stack([table[t] for t in texts])
    drawn = mine(queries, positives, docs, embed, Mining(sampling="random", range_max=10, seed=3))
    assert drawn == mine(queries, positives, docs, embed, Mining(sampling="random", range_max=10, seed=3))
    own = {}
    for q, p in zip(queries, positives):
        own.setdefault(q, set()).add(p)
    assert all(n not in own[q] for q, _, n in drawn) and len(drawn) == 3 * len(set(zip(queries, positives)))


def test_the_command_writes_triplets_supervised_simcse_reads(tmp_path, tiny_bert_dir, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("query\tpositive\n" + "".join(f"a man plays guitar {i}\ta man plays music {i}\n"
                                                    for i in range(8)))
    out = tmp_path / "mined.tsv"
    assert data_main(["mine-negatives", "--encoder", str(tiny_bert_dir), "--pairs", str(pairs), "--out", str(out),
                      "--num-negatives", "2", "--device", "cpu", "--no-progress"]) == 0
    rows = negatives.read_triplets(out)
    assert len(rows) == 16 and all(n != p for _, p, n in rows)
    assert "16 (anchor, positive, negative) rows for 8 pairs" in capsys.readouterr().out
    from types import SimpleNamespace

    from bertcf.objectives import SupervisedSimCSE
    examples = SupervisedSimCSE.read_examples(SimpleNamespace(train_file=[str(out)], method="simcse-sup"), None)
    assert [list(c) for c in examples.columns] == [list(c) for c in zip(*rows)]


def test_a_beir_set_is_mined_on_its_train_judgements(tmp_path, tiny_bert_dir, capsys):
    """--beir reads qrels/train.tsv (--split train, the default): never a test judgement as training data."""
    from bertcf.data import beir
    corpus = {f"d{i}": f"a man plays music number {i}" for i in range(10)}
    queries = {f"q{i}": f"who plays music {i}" for i in range(4)}
    beir.write(tmp_path / "set", corpus, queries, {"q0": {"d0": 1}, "q1": {"d1": 1}}, split="train")
    argv = ["mine-negatives", "--encoder", str(tiny_bert_dir), "--beir", str(tmp_path / "set"), "--num-negatives",
            "1", "--device", "cpu", "--no-progress"]
    assert data_main(argv + ["--out", str(tmp_path / "mined.tsv")]) == 0
    rows = negatives.read_triplets(tmp_path / "mined.tsv")
    assert [(q, p) for q, p, _ in rows] == [(queries["q0"], corpus["d0"]), (queries["q1"], corpus["d1"])]
    capsys.readouterr()
    assert data_main(argv + ["--split", "test", "--out", str(tmp_path / "test.tsv")]) == 2  # it has no test qrels
    assert "test" in capsys.readouterr().err and not (tmp_path / "test.tsv").exists()


def test_a_beir_set_without_train_judgements_names_the_file_it_lacks(tmp_path, tiny_bert_dir, capsys):
    """Only qrels/test.tsv: mining (--split train) names qrels/train.tsv, and the layout it shows
    is the one it reads (not one with qrels/test.tsv, which the set has)."""
    from bertcf.data import beir
    beir.write(tmp_path / "set", {"d0": "a man plays music"}, {"q0": "who plays music"}, {"q0": {"d0": 1}})
    assert (tmp_path / "set" / "qrels" / "test.tsv").is_file()
    assert data_main(["mine-negatives", "--encoder", str(tiny_bert_dir), "--beir", str(tmp_path / "set"), "--out",
                      str(tmp_path / "mined.tsv"), "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{tmp_path / 'set' / 'qrels' / 'train.tsv'} not found" in err, err
    assert "qrels/train.tsv)" in err and "qrels/test.tsv" not in err, err
    assert not (tmp_path / "mined.tsv").exists()


@pytest.mark.parametrize("content, message", [
    ("", "holds no (query, positive) pairs"),
    ("only one column\n", "line 1: expected query<TAB>positive"),
    ("q\t\n", "line 1: expected query<TAB>positive, found 2 tab-separated field(s) with a blank one"),
])
def test_bad_pairs_are_one_line_and_exit_2(tmp_path, tiny_bert_dir, capsys, content, message):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(content)
    assert data_main(["mine-negatives", "--encoder", str(tiny_bert_dir), "--pairs", str(pairs), "--out",
                      str(tmp_path / "o.tsv"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "o.tsv").exists()


def test_bad_controls_and_files(tmp_path):
    with pytest.raises(UsageError, match="only 2 candidate ranks"):
        Mining(num_negatives=3, range_min=8, range_max=10).window(1)
    with pytest.raises(DataError, match="no query got a negative"):
        negatives.write_triplets(tmp_path / "none.tsv", [])
    empty = tmp_path / "empty.tsv"
    empty.write_text("anchor\tpositive\tnegative\n")
    with pytest.raises(DataError, match="holds no triplets"):
        negatives.read_triplets(empty)
    (tmp_path / "bad.tsv").write_text("anchor\tpositive\tnegative\na\tb\n")
    with pytest.raises(DataError, match="line 2: expected anchor<TAB>positive<TAB>negative"):
        negatives.read_triplets(tmp_path / "bad.tsv")
