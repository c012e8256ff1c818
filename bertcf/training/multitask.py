"""Multitask fine-tuning (``run_multitask.py``; the report's sections 4.3 and 5.3) from a resolved
``MultitaskConfig`` (``run``). The model (one encoder, three heads, their losses and predictions)
is ``models.multitask.MultitaskModel``; with a flow or a linear head (``SentenceEncoder.dense``,
e.g. a whitening map), they are fine-tuned with the encoder unless frozen (``freeze_flow``,
``freeze_encoder``), and saved with it.

Pairs are encoded as two separate sentences (a bi-encoder), or with ``--pair-encoding cross``
together, one row ``[CLS] s1 [SEP] s2 [SEP]`` per pair (``models.multitask``). Each step draws one
batch of every task (32 SST sentences, 96 QQP pairs, 32 STS pairs; each task's data cycles on its
own), encodes all its sentences (288; 160 rows with joint pairs) in one pass and minimises
5 L_sst + 20 L_qqp + 1 L_sts (``MultitaskLoss``).
Every --eval-every steps the dev sets are scored (SST accuracy, QQP accuracy, STS Pearson r)
and the checkpoint with the best mean (``mean_dev``) is kept as ``best/`` (the encoder
checkpoint plus ``heads.safetensors``); at the end the best checkpoint writes the six CS224N
prediction files to ``predictions/`` and ``metrics.json``.
"""
from __future__ import annotations

import sys
from pathlib import Path

from minbert import pad_batch

from .. import runs
from ..config.multitask import MultitaskConfig
from ..data.multitask import check_files, fetch_data, load_data
from ..evaluation.multitask import SELECTION_METRIC, evaluate, summary_line, write_predictions
from ..models.cross_encoder import pad_pairs
from ..models.encoder import SentenceEncoder
from ..models.multitask import (
    TASKS,
    MultitaskLoss,
    MultitaskModel,
    checkpoint_meta,
    renamed_from_para,
    resolve_checkpoint,
    run_dir_of,
)
from ..utils.distributed import dist_info, local_rows, run_distributed, wrap_ddp
from .loop import TrainingLoop, set_seed
from .optim import make_optimizer, make_scheduler
from .sampler import EpochSampler


def run(config: MultitaskConfig) -> dict:
    """The run of ``config``: --predict-only writes the predictions of a finished run again;
    otherwise fine-tuning, in the run directory it names (held: one run per directory)."""
    if config.predict_only:
        return predict_only(config)
    with runs.hold(config.out_dir):  # one run per directory, from before anything is written
        check_files(config, why=fetch_data(config))
        return run_distributed(train, config)


def train_batch(train_sets: dict, rows: dict, pad_token_id: int, device) -> tuple[dict, dict]:
    """The inputs of one step, ``rows`` (task -> row indices) of each task's training set:
    (keyword arguments of :meth:`MultitaskModel.forward`, labels per task [len(rows)]).
    Every sentence of the step goes into one batch, padded to its longest sentence; the number
    of real tokens is counted here, on the host, so the unpadded encoder needs no GPU sync."""
    sentences, types, labels = [], [], {}
    for task, task_rows in rows.items():
        data = train_sets[task]
        for column in data.tokens:
            sentences += [column[i] for i in task_rows]
            types += [[] if data.token_types is None else data.token_types[i] for i in task_rows]
        labels[task] = data.label_tensor[task_rows].to(device, non_blocking=True)
    ids, mask = pad_batch(sentences, pad_token_id)
    inputs = {"input_ids": ids.to(device, non_blocking=True), "attention_mask": mask.to(device, non_blocking=True),
              "sizes": {task: len(task_rows) for task, task_rows in rows.items()}, "num_tokens": int(mask.sum())}
    if any(types):  # jointly encoded pairs: their token types (0 everywhere else)
        inputs["token_type_ids"] = pad_pairs(sentences, types, pad_token_id)[1].to(device, non_blocking=True)
    return inputs, labels


def make_samplers(sizes: dict, seed: int) -> dict:
    """One ``EpochSampler`` per task, each with its own seed, so every task's data cycles (and
    reshuffles) independently of the others."""
    return {task: EpochSampler(n, seed=seed + 1009 * i) for i, (task, n) in enumerate(sizes.items())}


def load_encoder(config: MultitaskConfig) -> SentenceEncoder:
    return SentenceEncoder.from_pretrained(runs.resolve_encoder_path(config.encoder), pooling=config.pooling,
                                           vocab=config.vocab, hidden_dropout_prob=config.dropout,
                                           attention_probs_dropout_prob=config.dropout)


def effective_max_length(config: MultitaskConfig, encoder) -> int:
    return min(config.max_length, encoder.bert.config.max_position_embeddings)


def predict_only(config: MultitaskConfig) -> dict:
    checkpoint = resolve_checkpoint(config.checkpoint)
    out_dir = Path(config.out_dir) if config.out_dir else run_dir_of(checkpoint)
    model = MultitaskModel.from_pretrained(checkpoint, vocab=config.vocab).to(config.device)
    data = load_data(config, model.encoder.tokenizer, effective_max_length(config, model.encoder),
                     splits=("dev", "test"), pair_encoding=model.pair_encoding)  # the checkpoint's
    meta = {"checkpoint": str(checkpoint), "step": checkpoint_meta(checkpoint).get("step")}
    with runs.hold(out_dir):  # not into a run directory that a run is writing
        metrics = write_predictions(model, data, out_dir, config.batch_size, config.precision, meta)
    print(summary_line(metrics, out_dir))
    return metrics


def build_model(config: MultitaskConfig, encoder, device) -> MultitaskModel:
    """The encoder and the three heads, frozen as asked, on ``device``."""
    model = MultitaskModel(encoder, proj_dim=config.proj_dim, sst_dropout=config.sst_dropout,
                           qqp_dropout=config.qqp_dropout, sts_dropout=config.sts_dropout,
                           qqp_margin=config.qqp_margin, sts_margin=config.sts_margin,
                           pair_encoding=config.pair_encoding)
    if config.freeze_encoder:
        encoder.requires_grad_(False)
    elif config.freeze_flow:
        for head in (encoder.flow, encoder.dense):
            if head is not None:
                head.requires_grad_(False)
    model.to(device)
    if config.compile:
        encoder.bert.compile_layers()
    return model


def train(config: MultitaskConfig, device) -> dict:
    set_seed(config.seed)
    encoder = load_encoder(config)
    max_length = effective_max_length(config, encoder)
    encoder.max_length = max_length
    data = load_data(config, encoder.tokenizer, max_length, pair_encoding=config.pair_encoding)
    model = build_model(config, encoder, device)
    train_sets = {t: data[t, "train"] for t in TASKS}
    dev_sets = {t: data[t, "dev"] for t in TASKS}
    batch_sizes = {t: getattr(config, f"{t}_batch_size") for t in TASKS}
    multitask_loss = MultitaskLoss({t: getattr(config, f"{t}_weight") for t in TASKS}, config.qqp_margin,
                                   config.sts_margin, config.pair_encoding)
    samplers = make_samplers({t: len(d) for t, d in train_sets.items()}, config.seed)
    rank, world = dist_info()
    pad_id = encoder.tokenizer.pad_token_id
    step_model = wrap_ddp(model, device)

    def step_fn(step):
        rows = {task: samplers[task].next(batch_sizes[task])[local_rows(batch_sizes[task], rank, world)]
                for task in TASKS}
        inputs, labels = train_batch(train_sets, rows, pad_id, device)
        loss, parts = multitask_loss(step_model(**inputs), labels)
        return loss, {f"loss_{t}": parts[t].detach() for t in TASKS}

    def evaluate_fn(step):
        return evaluate(model, dev_sets, config.batch_size, config.precision, config.max_eval_examples)

    run = runs.Run(config.out_dir, config.to_dict(), resume=config.resume)
    optimizer = make_optimizer(model.parameters(), config.lr, config.weight_decay, device)
    scheduler = make_scheduler(optimizer, config.lr_schedule, config.warmup_steps, config.steps)
    loop = None

    def save_model(directory):
        model.save_pretrained(directory, extra={"step": loop.step})

    loop = TrainingLoop(config, run, {"model": model}, optimizer, scheduler, samplers, metric=SELECTION_METRIC,
                        save_model=save_model, evaluate=evaluate_fn, items_per_step=sum(  # sequences encoded
                            batch_sizes[t] * (1 if t == "sst" or config.pair_encoding == "cross" else 2)
                            for t in TASKS),
                        upgrade_state=renamed_from_para)
    if config.resume:
        loop.resume()
    summary = loop.fit(step_fn)
    return finish(config, summary, run.dir, data, device) if rank == 0 else summary


def finish(config: MultitaskConfig, summary: dict, run_dir: Path, data: dict, device) -> dict:
    """After training: the best checkpoint's predictions and metrics.json (not after a stop)."""
    if summary["interrupted"]:
        print(f"no predictions written (interrupted); continue with --resume --out-dir {run_dir}", file=sys.stderr)
        return summary
    best = MultitaskModel.from_pretrained(run_dir / "best", vocab=config.vocab).to(device)
    meta = {"checkpoint": str(run_dir / "best"), "step": checkpoint_meta(run_dir / "best").get("step")}
    summary["metrics"] = write_predictions(best, data, run_dir, config.batch_size, config.precision, meta)
    print(f"mean dev (during training): step 0 {summary['first']:.4f}, best {summary['best']:.4f} "
          f"at step {summary['best_step']}")
    print(summary_line(summary["metrics"], run_dir))
    return summary
