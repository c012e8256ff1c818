"""The one pair scorer (issue 58): ``CrossEncoder.relevance`` (the log-odds: reranking, GPL's
margins, the pair sets' sigmoid scores) and ``load_cross_encoder`` (what refuses a checkpoint that
scores no relevance, for ``evaluate --rerank`` and GPL's ``--cross-encoder`` alike); and long
scoring's progress (issue 59): the pairs scored and the time left, as plain lines in a log."""
from __future__ import annotations

import re

import pytest
import torch
from helpers import assert_one_error_line, write_cs224n_files, write_lines

from bertcf.cross.evaluation import pair_scores
from bertcf.errors import UsageError
from bertcf.models.cross_encoder import CrossEncoder, load_cross_encoder
from bertcf.utils import progress
from minbert import CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [("how do i learn english", "what is the best way to learn english"), ("a cat", "the market"),
         ("how can i cook rice", "what is the easiest way to cook rice"), ("hello", "world")]
ROWS = [("how do i learn english", "what is the best way to learn english", "a cat"),
        ("how can i cook rice", "what is the easiest way to cook rice", "a cat"),
        ("how do i learn english", "what is the best way to learn english", "the market")]


def cross_encoder(bert_dir, num_labels: int) -> CrossEncoder:
    torch.manual_seed(num_labels)
    model = CrossEncoder.from_pretrained(bert_dir, num_labels=num_labels)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 3.0)
    return model


@pytest.mark.parametrize("num_labels", [1, 2])
def test_relevance_is_the_log_odds_and_margins_its_differences(tiny_bert_dir, num_labels):
    model = cross_encoder(tiny_bert_dir, num_labels)
    logits = model.predict(PAIRS, raw_logits=True)
    expected = logits if num_labels == 1 else logits[:, 1] - logits[:, 0]
    # other batches (3 here, predict's own there) pad otherwise and round otherwise: logits of about 1
    # from classifier weights of scale 3 moved by 1.3e-6 on an AMD EPYC
    torch.testing.assert_close(model.relevance(PAIRS, batch_size=3), expected, rtol=1e-5, atol=1e-6)
    # the pair sets' score is its sigmoid: the probability of label 1 (for two labels, their softmax's)
    probability = torch.sigmoid(logits) if num_labels == 1 else torch.softmax(logits, dim=1)[:, 1]
    torch.testing.assert_close(pair_scores(model, PAIRS), probability, rtol=0, atol=1e-6)
    # GPL's margins: CE(q, pos) - CE(q, neg), each distinct pair scored once
    score = dict(zip(PAIRS + [(q, n) for q, _, n in ROWS], model.relevance(
        PAIRS + [(q, n) for q, _, n in ROWS]).tolist()))
    margins = model.margins(ROWS, batch_size=2)
    assert [m[:3] for m in margins] == ROWS
    assert [m[3] for m in margins] == pytest.approx([score[q, p] - score[q, n] for q, p, n in ROWS], abs=1e-5)


def test_three_classes_give_no_relevance(tiny_bert_dir):
    with pytest.raises(UsageError, match="of 3 classes gives no similarity score"):
        cross_encoder(tiny_bert_dir, 3).relevance(PAIRS)


def test_load_cross_encoder_refuses_what_scores_no_relevance(tiny_bert_dir, tmp_path):
    cross_encoder(tiny_bert_dir, 3).save_pretrained(tmp_path / "nli")
    cross_encoder(tiny_bert_dir, 1).save_pretrained(tmp_path / "ce")
    with pytest.raises(UsageError, match=r"^--cross-encoder .* is not a cross-encoder \(a \.\.\.ForSequence"):
        load_cross_encoder(tiny_bert_dir, "--cross-encoder")  # a plain BERT: its classifier would be random
    with pytest.raises(UsageError, match=r"^--rerank .*nli: a cross-encoder of 3 classes gives no relevance"):
        load_cross_encoder(tmp_path / "nli", "--rerank")
    with pytest.raises(UsageError, match=r"^--rerank .*absent cannot be loaded \(not found"):
        load_cross_encoder(tmp_path / "absent", "--rerank")
    model = load_cross_encoder(tmp_path / "ce", "--rerank", "cpu", max_length=16, precision="fp32")
    assert model.num_labels == 1 and model.max_length == 16 and model.precision == "fp32"
    with pytest.raises(CheckpointError):  # the model's own loader names no flag
        CrossEncoder.from_pretrained(tmp_path / "absent")


def test_gpl_refuses_a_plain_bert_as_its_cross_encoder(tiny_bert_dir, tmp_path, capsys):
    """GPL loaded its cross-encoder with sentence-transformers, which gives a plain BERT a random
    head ("newly initialized") and trained on margins of about 0.0001; ``evaluate --rerank`` refused
    the same checkpoint. Both go through ``load_cross_encoder`` now."""
    from bertcf.gpl import command as gpl_command

    data = write_cs224n_files(tmp_path / "data")
    passages = write_lines(tmp_path / "passages.txt", [f"passage {i} about cooking rice and dogs" for i in range(8)])
    pairs = write_lines(tmp_path / "pairs.tsv", ["query\tpositive"] + [f"question {i} ?\tpassage {i} about cooking "
                                                                      f"rice and dogs" for i in range(8)])
    out = tmp_path / "out"
    status = gpl_command.main(["--encoder", str(tiny_bert_dir), "--out", str(out), "--queries", str(pairs),
                               "--corpus", str(passages), "--cross-encoder", str(tiny_bert_dir), "--data-dir",
                               str(data), "--device", "cpu", "--progress", "none", "--range-max", "4",
                               "--num-negatives", "1", "--steps", "2"])
    assert status == 2
    assert_one_error_line(capsys, f"--cross-encoder {tiny_bert_dir} is not a cross-encoder")
    assert not (out / "margins.tsv").exists()


def test_long_scoring_shows_the_pairs_scored_and_the_time_left(tiny_bert_dir, monkeypatch, capsys):
    """`python -m bertcf.cross train` scored QQP dev's 3,954 pairs for minutes without a word."""
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    model = cross_encoder(tiny_bert_dir, 1)
    many = PAIRS * 10
    pair_scores(model, many, batch_size=4, show_progress_bar="lines", name="score qqp-dev")
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert re.fullmatch(r"score qqp-dev: 4/40 pairs \(10%\), [\d,.]+ pairs/s, 0:00:00 elapsed, ~\d:\d\d:\d\d left",
                        lines[0]), lines
    assert lines[-1].startswith("score qqp-dev: 40/40 pairs (100%)")
