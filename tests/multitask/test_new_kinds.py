"""The two task kinds added as one head class each (issue 67): ``regression`` (one sentence, a
score) and ``pair-ranking`` (positive pairs, in-batch negatives). Each loss equals
sentence-transformers' on the same vectors (MSELoss on a one-wide output; MultipleNegativesRankingLoss),
and a short stage-3 run trains and scores each kind declared with --task."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from helpers import ENTAILED, PREMISES, cs224n_sentence, multitask_argv, quiet_multitask, refused
from helpers import write_cs224n_files

from bertcf.multitask.heads import PairRankingHead, RegressionHead, Widths, build_head
from bertcf.multitask.tasks import Task

pytestmark = pytest.mark.usefixtures("one_thread")

with warnings.catch_warnings():  # sentence-transformers 6 moved its losses; either path works
    warnings.simplefilter("ignore", DeprecationWarning)
    from sentence_transformers.sentence_transformer.losses import MSELoss, MultipleNegativesRankingLoss

RATING = Task("rating", "regression", train="x", dev="y", label_column="score", label_range=(1.0, 5.0), dropout=0.0)
PAIRS = Task("pairs", "pair-ranking", train="x", dev="y", text_columns=("question", "paraphrase"), dropout=0.0)
WIDTHS = Widths(sentence=12, hidden=12, proj=6)


# ---- the losses against sentence-transformers' -------------------------------------------------------
def test_regression_is_sentence_transformers_mse_on_the_same_vectors():
    torch.manual_seed(0)
    head = build_head(RATING, WIDTHS)
    assert type(head) is RegressionHead and head.linear.out_features == 1
    u, gold = torch.randn(7, 12), torch.tensor([1.0, 5.0, 2.5, 3.0, 4.2, 1.1, 3.3])
    scores = head(u)
    assert scores.shape == (7,)
    theirs = MSELoss(torch.nn.Identity()).compute_loss_from_embeddings([scores[:, None]], [((gold - 1) / 4)[:, None]])
    torch.testing.assert_close(head.loss(scores, gold), theirs, rtol=1e-6, atol=1e-7)
    # the prediction: the score rescaled from [0, 1] to the declared range, clamped
    assert head.predictions(torch.tensor([0.0, 0.5, 1.0, 1.4, -0.1])).tolist() == pytest.approx([1, 3, 5, 5, 1])


def test_pair_ranking_is_multiple_negatives_ranking_on_the_same_vectors():
    torch.manual_seed(0)
    head = build_head(PAIRS, WIDTHS)
    assert type(head) is PairRankingHead and head.rows_per_example == 2 and head.linear.out_features == 6
    u, v = torch.randn(5, 12), torch.randn(5, 12)
    p1, p2 = head(torch.cat([u, v]))  # each sentence projected, one call
    theirs = MultipleNegativesRankingLoss(torch.nn.Identity()).compute_loss_from_embeddings([p1, p2], torch.ones(5))
    torch.testing.assert_close(head.loss((p1, p2), torch.ones(5, dtype=torch.long)), theirs, rtol=1e-5, atol=1e-6)
    assert head.view((p1, p2)).shape == (5, 5)  # SMART compares the in-batch logits


def test_pair_ranking_scores_are_reciprocal_ranks_over_the_dev_pairs():
    head = build_head(PAIRS, Widths(sentence=2, hidden=2, proj=2)).eval()
    with torch.no_grad():
        head.linear.weight.copy_(torch.eye(2))
        head.linear.bias.zero_()

    def at(angles):  # unit vectors at these angles: cosine falls with the angle between them
        angles = torch.tensor(angles)
        return torch.stack([angles.cos(), angles.sin()], dim=-1)
    first, second = at([0.0, 1.0, 2.0, 3.0]), at([0.5, 1.9, 2.4, 2.2])
    rr = head.scores(torch.cat([first, second]), 4)
    # row 0's own is the closest; row 1's second to 0.5; row 2's third to 1.9 and 2.2; row 3's second to 2.4
    by_hand = [1, 1 / 2, 1 / 3, 1 / 2]
    assert rr.tolist() == pytest.approx(by_hand)
    head.ROWS = 3  # in blocks of rows: the same ranks
    assert head.scores(torch.cat([first, second]), 4).tolist() == pytest.approx(by_hand)
    assert head.predictions(rr).tolist() == pytest.approx(by_hand)


# ---- declared and trained --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = write_cs224n_files(tmp_path_factory.mktemp("new-kinds"))
    for split, n in (("train", 16), ("dev", 8)):
        (d / f"rating-{split}.tsv").write_text("sentence\tscore\n" + "".join(
            f"{cs224n_sentence(i + 3 * len(split))}\t{1 + (i * 0.7) % 4:.1f}\n" for i in range(n)))
        (d / f"pairs-{split}.tsv").write_text("question\tparaphrase\n" + "".join(
            f"{PREMISES[i % 4]} {cs224n_sentence(i + len(split))}\t{ENTAILED[i % 4]}\n" for i in range(n)))
    return d


def declarations(d: Path) -> list[str]:
    """--task with both declarations (several after one --task)."""
    return ["--task", f"name=rating,kind=regression,train={d / 'rating-train.tsv'},dev={d / 'rating-dev.tsv'},"
                      f"label_column=score,label_range=1;5,batch_size=4",
            f"name=pairs,kind=pair-ranking,train={d / 'pairs-train.tsv'},dev={d / 'pairs-dev.tsv'},"
                      f"text_columns=question;paraphrase,batch_size=4"]


def test_a_run_trains_and_scores_both_kinds(tiny_bert_dir, data_dir, tmp_path):
    out = tmp_path / "run"
    summary = quiet_multitask(multitask_argv(tiny_bert_dir, data_dir, out, 4, *declarations(data_dir),
                                             "--tasks", "sst,rating,pairs"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert summary["step"] == 4
    assert -1 <= metrics["rating_pearson"] <= 1 and 1 / 8 <= metrics["pairs_mrr"] <= 1
    assert metrics["mean_dev"] == pytest.approx((metrics["sst_acc"] + metrics["rating_pearson"] + metrics["pairs_mrr"]) / 3)
    lo, hi = metrics["pairs_mrr_ci95"]
    assert lo <= metrics["pairs_mrr"] <= hi and metrics["pairs_dev_examples"] == 8
    ranks = (out / "predictions" / "pairs-dev-output.csv").read_text().splitlines()
    assert ranks[0] == "id \t Predicted_Score " and len(ranks) == 9
    assert sum(float(line.split(" , ")[1]) for line in ranks[1:]) / 8 == pytest.approx(metrics["pairs_mrr"], abs=1e-4)
    ratings = [float(line.split(" , ")[1]) for line in (out / "predictions" / "rating-dev-output.csv").read_text().splitlines()[1:]]
    assert len(ratings) == 8 and all(1 <= r <= 5 for r in ratings)
    # with SMART too: each head's view perturbed (the ranking logits, the score)
    quiet_multitask(multitask_argv(tiny_bert_dir, data_dir, tmp_path / "smart", 2, *declarations(data_dir),
                                   "--tasks", "rating,pairs", "--smart-weight", "1"))


def test_pair_ranking_is_not_read_jointly(tiny_bert_dir, data_dir, tmp_path, capsys):
    refused(multitask_argv(tiny_bert_dir, data_dir, tmp_path / "run", 2, *declarations(data_dir),
                           "--tasks", "sst,pairs", "--pair-encoding", "cross"),
            capsys, "pairs", "pair-ranking", "--pair-encoding cross")
