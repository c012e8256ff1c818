"""``run_pretrain.py --stage whiten``: BERT-whitening (``bertcf.models.whitening``) fitted in closed
form on the encoder's vectors of a set of sentences and kept as the encoder's linear head
(``SentenceEncoder.dense``, sentence-transformers' Dense module in the checkpoint). No training
loop: the sentences are encoded once, the map is computed in float64, the whitened encoder is
evaluated once. The run directory is the other stages' (config.json, metrics.jsonl with that one
evaluation at step 0, tb/, best/ and last/, the same checkpoint, each with its model card), so
every command that takes a run takes this one.

The fitting set (``--whiten-on``): the pretraining corpus, or the target sets' own sentences, the
paper's "target" variant (Su et al. 2021 fit on all the sentences of the STS set they score:
unsupervised, no scores are read, but the evaluation sentences themselves).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..data.senteval import (
    SICK_FILES,
    STS_YEARS,
    STSB_FILES,
    read_sick,
    read_sts_year,
    read_stsb,
    sts_year_dir,
)
from ..data.tasks import read_sts, task_file
from ..errors import DataError, UsageError
from ..models.model_card import write_model_card
from ..models.whitening import fit_whitening
from ..runs import Run
from ..utils import progress
from ..utils.files import save_dir_atomic, write_json_atomic

ENCODE_BATCH = 64  # sentences encoded at once (as the evaluation; --batch-size is the training batch)


def target_sentences(whiten_on: str, data_dir, senteval_dir) -> list[str]:
    """Both sentences of every pair of the target set ``whiten_on`` (any key of
    ``config.pretrain.WHITEN_ON`` but corpus), in file order, duplicates kept: the paper's fit weighs
    a sentence by how often the scored pairs hold it. DataError when the files are missing."""
    senteval_dir = Path(senteval_dir)
    if whiten_on == "sts-dev":
        pairs = read_sts(task_file(data_dir, "sts", "dev"))
    elif whiten_on in ("stsb", "stsb-test"):
        splits = ("train", "dev", "test") if whiten_on == "stsb" else ("test",)
        pairs = [p for split in splits for p in read_stsb(senteval_dir / STSB_FILES[split])]
    else:
        pairs = [p for year in STS_YEARS if sts_year_dir(senteval_dir, year).is_dir()
                 for subset in read_sts_year(senteval_dir, year).values() for p in subset]
        if (senteval_dir / STSB_FILES["test"]).is_file():
            pairs += read_stsb(senteval_dir / STSB_FILES["test"])
        if (senteval_dir / SICK_FILES["test"]).is_file():
            pairs += read_sick(senteval_dir / SICK_FILES["test"])
        if not pairs:
            raise DataError(f"--whiten-on senteval-sts: no SentEval STS set in {senteval_dir} (see data/README.md)")
    return [p.sentence1 for p in pairs] + [p.sentence2 for p in pairs]


def whiten(encoder, sentences: list[str], dim: int | None, show_progress_bar: bool = False) -> dict:
    """Fit the whitening of ``encoder``'s vectors of ``sentences`` (after its flow, if it has one;
    a linear head it had is replaced) and set it as ``encoder.dense``. Returns what was fitted:
    {"sentences", "width" (D), "dim" (kept), "rank", "eigenvalue_ratio"}."""
    encoder.dense = None
    # The head comes before any normalisation (a checkpoint with a Normalize module, as MiniLM's): fit on
    # the vectors it will receive, not on unit vectors.
    vectors = encoder.encode(sentences, batch_size=ENCODE_BATCH, show_progress_bar=show_progress_bar,
                             normalize=False)
    try:
        fit = fit_whitening(vectors, dim)
    except ValueError as e:
        raise DataError(f"cannot whiten the encoder's vectors of {len(sentences)} sentences: {e}") from None
    if dim is not None and fit.dim < dim:
        print(f"note: --whiten-dim {dim}: the covariance of {fit.sentences} vectors has rank {fit.rank}, so the "
              f"head keeps {fit.dim} directions (the others have no variance to whiten)", file=sys.stderr)
    encoder.dense = fit.linear().to(encoder.device)
    kept = fit.eigenvalues[:fit.dim]
    return {"sentences": fit.sentences, "width": vectors.shape[1], "dim": fit.dim, "rank": fit.rank,
            "eigenvalue_ratio": float(kept[0] / kept[-1])}


def run(settings, encoder, sentences: list[str], evaluator, metric: str) -> dict:
    """The whole stage: ``encoder`` (on its device) whitened on ``sentences`` (``settings``: a
    ``PretrainConfig`` of --stage whiten), scored by ``evaluator`` (the STS-dev evaluator of
    ``--select-on``, whose ``metric`` the card names) before and after, written into its out_dir.
    Returns the summary of a training run (step 0, "first": the unwhitened score, "best": the
    whitened one)."""
    if settings.resume:
        raise UsageError("--stage whiten has nothing to resume (one closed-form fit): run it again with a new --out-dir")
    if settings.whiten_dim is not None and settings.whiten_dim > encoder.dim:
        raise UsageError(f"--whiten-dim {settings.whiten_dim} is more than the encoder's {encoder.dim} dimensions")
    started = time.perf_counter()
    config = settings.to_dict() | {"steps": 0}  # config.json says what ran: no optimiser step
    run_dir = Run(settings.out_dir, config)
    run_dir.start(0)
    show = progress.resolve(settings.progress) == "bar"
    had_head = encoder.dense is not None
    encoder.dense = None
    before = evaluator(encoder)[metric]
    info = whiten(encoder, sentences, settings.whiten_dim, show) | {"fitted_on": f"--whiten-on {settings.whiten_on}",
                                                                 "replaced_a_head": had_head}
    result = evaluator(encoder)
    run_dir.histogram(0, "eval/sts_dev_cosines", result.pop("cosines"))
    run_dir.metrics(0, result | {f"unwhitened_{metric}": before, "whiten_sentences": info["sentences"],
                                 "whiten_dim": info["dim"], "whiten_rank": info["rank"]})
    config["whitening"] = info
    write_json_atomic(run_dir.dir / "config.json", config)  # the settings, and what the fit found

    def write(link_from=None):
        def checkpoint(tmp):
            encoder.save_pretrained(tmp, link_weights_from=link_from)
            write_model_card(tmp, config, metric, result[metric], 0, whitening=info)
        return checkpoint

    save_dir_atomic(run_dir.dir / "best", write())
    save_dir_atomic(run_dir.dir / "last", write(run_dir.dir / "best" / "model.safetensors"))
    run_dir.close()
    wall = time.perf_counter() - started
    return {"step": 0, "first": before, "best": result[metric], "best_step": 0, "interrupted": False,
            "wall_s": wall, "whitening": info}


def final_line(summary: dict, run_dir, label: str) -> str:
    """What the stage prints last: the score before and after, what was kept, where the checkpoint is."""
    w = summary["whitening"]
    return (f"{label}: {summary['first']:.4f} before whitening, {summary['best']:.4f} whitened ({w['dim']} of "
            f"{w['width']} directions, fitted on {w['sentences']} sentences, {w['fitted_on']}, in "
            f"{summary['wall_s']:.0f} s); checkpoint: {Path(run_dir) / 'best'}")
