"""Multitask fine-tuning behind ``run_multitask.py`` (the report's sections 4.3 and 5.3): the
task data, the training loop, evaluation and the CS224N prediction files. The model (one encoder,
three heads, their losses and predictions) is ``bertcf.models.multitask.MultitaskModel``; with a
flow or a linear head (``SentenceEncoder.dense``, e.g. a whitening map), they are fine-tuned with
the encoder unless frozen (``--freeze-flow``, ``--freeze-encoder``), and saved with it.

Pairs are encoded as two separate sentences (a bi-encoder). Each step draws one batch of every
task (32 SST sentences, 96 QQP pairs, 32 STS pairs; each task's data cycles on its own), encodes
all 288 sentences in one pass and minimises 5 L_sst + 20 L_qqp + 1 L_sts (:class:`MultitaskLoss`).
Every --eval-every steps the dev sets are scored (SST accuracy, QQP accuracy, STS Pearson r)
and the checkpoint with the best mean (``mean_dev``) is kept as ``best/`` (the encoder
checkpoint plus ``heads.safetensors``); at the end the best checkpoint writes the six CS224N
prediction files to ``predictions/`` and ``metrics.json``.
"""
from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from minbert import pad_batch

from . import cli, runs, training
from .data.download import fetch_missing
from .data.tasks import READERS, SPLITS, task_file
from .errors import DataError, UsageError
from .evaluation.multitask import METRICS, SELECTION_METRIC, mean_dev, task_interval, task_metric
from .models.encoder import POOLINGS, SentenceEncoder
from .models.multitask import (
    TASKS,
    MultitaskLoss,
    MultitaskModel,
    checkpoint_meta,
    clamped_cosine,
    predict_paraphrase,
    predict_sentiment,
    predict_similarity,
    renamed_from_para,
    resolve_checkpoint,
    run_dir_of,
)
from .runs import resolve_encoder_path as resolve_encoder_source  # --encoder: a run directory -> its best/
from .utils.distributed import dist_info, local_rows, run_distributed, wrap_ddp
from .utils.files import save_dir_atomic, write_json_atomic

logger = logging.getLogger("bertcf.multitask")

PREDICTION_HEADERS = {"sst": "Predicted_Sentiment", "qqp": "Predicted_Is_Paraphrase",
                      "sts": "Predicted_Similiary"}  # sic: the CS224N starter's spelling


def prediction_file(task: str, split: str) -> str:
    """The CS224N name of a prediction file: QQP's are para-{split}-output.csv."""
    return f"{'para' if task == 'qqp' else task}-{split}-output.csv"


# ---- data -------------------------------------------------------------------------------------------
@dataclass
class TaskData:
    """One task file, tokenised once: ``ids`` [n]; ``tokens``: one list of token-id lists per
    text column (1 for SST, 2 for pairs); ``labels`` [n] (None for unlabeled rows)."""

    task: str
    path: Path
    ids: list[str]
    tokens: tuple[list[list[int]], ...]
    labels: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, rows) -> "TaskData":
        rows = list(rows)
        return TaskData(self.task, self.path, [self.ids[i] for i in rows],
                        tuple([col[i] for i in rows] for col in self.tokens), [self.labels[i] for i in rows])

    def labeled(self, limit: int | None = None) -> "TaskData":
        """The rows with a label (the first ``limit`` of them)."""
        rows = [i for i, label in enumerate(self.labels) if label is not None]
        return self.subset(rows[:limit] if limit else rows)

    @cached_property
    def label_tensor(self) -> torch.Tensor:
        """The labels as a tensor (long for SST, float32 for pairs); labeled sets only."""
        dtype = torch.long if self.task == "sst" else torch.float32
        return torch.tensor(self.labels, dtype=dtype)


def tokenize_column(tokenizer, sentences, max_length: int) -> list[list[int]]:
    return tokenizer(list(sentences), truncation=True, max_length=max_length,
                     return_attention_mask=False, return_token_type_ids=False)["input_ids"]


def _columns(task, rows):
    if task == "sst":
        return ([r.sentence for r in rows],)
    return [r.sentence1 for r in rows], [r.sentence2 for r in rows]


def load_task(task: str, split: str, path, tokenizer, max_length: int, limit: int | None = None) -> TaskData:
    """Read and tokenise one file. train: labeled rows (the first ``limit``); dev: every row,
    with the labels of the labeled ones (every id gets a prediction); test: every row."""
    path = Path(path)
    reader = READERS[task]
    if split == "train":
        rows = reader(path, labeled=True)[:limit]
        labels = [r.label for r in rows]
    elif split == "dev":
        gold = {r.id: r.label for r in reader(path, labeled=True)}
        data_logger = logging.getLogger("bertcf.data")
        level = data_logger.level
        data_logger.setLevel(logging.ERROR)  # the labeled read above already warned about skipped rows
        try:
            rows = reader(path, labeled=False)
        finally:
            data_logger.setLevel(level)
        labels = [gold.get(r.id) for r in rows]
    else:
        rows = reader(path, labeled=False)
        labels = [None] * len(rows)
    if task == "sst":
        labels = [None if l is None else int(l) for l in labels]
    tokens = tuple(tokenize_column(tokenizer, col, max_length) for col in _columns(task, rows))
    return TaskData(task, path, [r.id for r in rows], tokens, labels)


def file_flag(task: str, split: str) -> str:
    return f"{task}_{split}"


def task_paths(args) -> dict:
    """(task, split) -> Path from the per-file flags (defaults: the standard names in --data-dir)."""
    return {(t, s): Path(getattr(args, file_flag(t, s)) or task_file(args.data_dir, t, s))
            for t in TASKS for s in SPLITS}


def check_files(args, splits=SPLITS, why: str | None = None) -> dict:
    """task_paths(args), after checking that the train and dev files among ``splits`` exist
    (``why``: why a missing one was not downloaded, for the error line)."""
    paths = task_paths(args)
    for (task, split), path in paths.items():
        if split in splits and split != "test" and not path.is_file():
            because = f"; {why}" if why else ""
            raise DataError(f"{path} not found (set --data-dir or --{task}-{split}{because})")
    return paths


def fetch_data(args) -> str | None:
    """When a train or dev file is missing from --data-dir (where no --{task}-{split} flag points
    elsewhere), download the missing CS224N files, the test files too (for the predictions);
    returns why that failed, or None."""
    missing = {(t, s): task_file(args.data_dir, t, s) for t in TASKS for s in SPLITS
               if getattr(args, file_flag(t, s)) is None and not task_file(args.data_dir, t, s).is_file()}
    if all(split == "test" for _, split in missing):
        return None
    return fetch_missing(args.data_dir, [path.name for path in missing.values()])


def load_data(args, tokenizer, max_length: int, splits=SPLITS) -> dict:
    """(task, split) -> TaskData, or None for an absent test file (skipped with a warning).
    Train and dev files must exist (DataError otherwise), checked before anything is read."""
    paths = check_files(args, splits)
    data = {}
    for (task, split), path in paths.items():
        if split not in splits:
            continue
        if split == "test" and not path.exists():
            logger.warning("warning: %s not found: no %s test predictions", path, task)
            data[task, split] = None
            continue
        limit = args.max_train_examples if split == "train" else None
        data[task, split] = load_task(task, split, path, tokenizer, max_length, limit)
    return data


def train_batch(train_sets: dict, rows: dict, pad_token_id: int, device) -> tuple[dict, dict]:
    """The inputs of one step, ``rows`` (task -> row indices) of each task's training set:
    (keyword arguments of :meth:`MultitaskModel.forward`, labels per task [len(rows)]).
    Every sentence of the step goes into one batch, padded to its longest sentence; the number
    of real tokens is counted here, on the host, so the unpadded encoder needs no GPU sync."""
    sentences, labels = [], {}
    for task, task_rows in rows.items():
        data = train_sets[task]
        for column in data.tokens:
            sentences += [column[i] for i in task_rows]
        labels[task] = data.label_tensor[task_rows].to(device, non_blocking=True)
    ids, mask = pad_batch(sentences, pad_token_id)
    inputs = {"input_ids": ids.to(device, non_blocking=True), "attention_mask": mask.to(device, non_blocking=True),
              "sizes": {task: len(task_rows) for task, task_rows in rows.items()}, "num_tokens": int(mask.sum())}
    return inputs, labels


def make_samplers(sizes: dict, seed: int) -> dict:
    """One :class:`training.EpochSampler` per task, each with its own seed, so every task's
    data cycles (and reshuffles) independently of the others."""
    return {task: training.EpochSampler(n, seed=seed + 1009 * i) for i, (task, n) in enumerate(sizes.items())}


# ---- inference --------------------------------------------------------------------------------------
@torch.inference_mode()
def predict(model: MultitaskModel, data: TaskData, batch_size: int = 128, precision: str | None = None) -> torch.Tensor:
    """Predictions for every row: SST class [n] long, QQP 0/1 [n] long, STS score in [0, 5] [n]."""
    was_training = model.training
    model.eval()
    try:
        # Both columns of a pair task in one length-sorted pass, then split again.
        vectors = model.encoder.encode_ids([t for col in data.tokens for t in col], batch_size, precision)
        vectors = vectors.to(model.device).split(len(data))
        head = model.head(data.task)
        if data.task == "sst":
            return predict_sentiment(head(vectors[0]).float()).cpu()
        y = clamped_cosine(head(vectors[0]), head(vectors[1]),
                           model.qqp_margin if data.task == "qqp" else model.sts_margin).cpu()
    finally:
        model.train(was_training)
    if data.task == "qqp":
        return predict_paraphrase(y, model.qqp_margin)
    return predict_similarity(y, model.sts_margin)


def evaluate(model: MultitaskModel, dev: dict, batch_size: int = 128, precision: str | None = None,
             limit: int | None = None) -> dict:
    """{'sst_acc', 'qqp_acc', 'sts_pearson', 'mean_dev'} on the labeled rows of the dev sets
    (``dev``: task -> TaskData; ``limit``: the first rows of each only)."""
    metrics = {}
    for task in TASKS:
        data = dev[task].labeled(limit)
        metrics[METRICS[task]] = task_metric(task, predict(model, data, batch_size, precision), data.labels)
    metrics[SELECTION_METRIC] = mean_dev(metrics)
    return metrics


def format_prediction(task: str, value) -> str:
    return f"{float(value):.4f}" if task == "sts" else str(int(value))


def write_predictions(model: MultitaskModel, data: dict, out_dir, batch_size: int = 128,
                      precision: str | None = None, meta: dict | None = None) -> dict:
    """Write OUT/predictions/ (the six CS224N files: 'id \\t Predicted_... ' then 'id , value'
    per row; an absent test set is left out) and OUT/metrics.json (the dev metrics of every
    labeled row, each with its bootstrap interval ``*_ci95``), both atomically. Returns the metrics."""
    out_dir = Path(out_dir)
    files, metrics = {}, {}
    for task in TASKS:
        for split in ("dev", "test"):
            d = data.get((task, split))
            if d is None:
                continue
            predicted = predict(model, d, batch_size, precision)
            lines = [f"id \t {PREDICTION_HEADERS[task]} \n"]
            lines += [f"{i} , {format_prediction(task, v)} \n" for i, v in zip(d.ids, predicted.tolist())]
            files[prediction_file(task, split)] = "".join(lines)
            if split == "dev":
                rows = [k for k, label in enumerate(d.labels) if label is not None]
                gold = [d.labels[k] for k in rows]
                metrics[METRICS[task]] = task_metric(task, predicted[rows], gold)
                metrics[f"{METRICS[task]}_ci95"] = task_interval(task, predicted[rows], gold)
                metrics[f"{task}_dev_examples"] = len(rows)
    metrics = {k: metrics[k] for k in METRICS.values()} | {SELECTION_METRIC: mean_dev(metrics)} \
        | {k: v for k, v in metrics.items() if k not in METRICS.values()} | (meta or {})

    def write(tmp):
        for name, text in files.items():
            (tmp / name).write_text(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_dir_atomic(out_dir / "predictions", write)
    write_json_atomic(out_dir / "metrics.json", metrics)
    return metrics


# ---- command line -----------------------------------------------------------------------------------
MARGIN = cli.checked(float, lambda v: -1 <= v < 1, "in [-1, 1)")  # h of y = max(cos, h)


def build_parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog="run_multitask.py", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("model")
    g.add_argument("--encoder", default=None,
                   help="a pretraining run directory or checkpoint (flow included when it has one), or a "
                        "Hugging Face BERT name or directory (default: --init, else --model)")
    g.add_argument("--freeze-encoder", action="store_true",
                   help="train the heads only (encoder, flow and the encoder's linear head frozen)")
    g.add_argument("--freeze-flow", action="store_true",
                   help="with a flow or a linear head (whitening): keep them fixed, train the encoder")
    g.add_argument("--dropout", type=cli.PROBABILITY, default=0.1, help="encoder dropout (hidden and attention)")
    g.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="default: the checkpoint's (mean); first-last-avg: the average of the first and the last "
                        "layer's token means")
    g.add_argument("--vocab", default=None, help="vocab.txt for a checkpoint directory without tokenizer files")
    g.add_argument("--proj-dim", type=cli.AT_LEAST_1, default=768, help="output width of the QQP and STS heads")
    g.add_argument("--sst-dropout", type=cli.PROBABILITY, default=0.3, help="dropout before the SST head")
    g.add_argument("--qqp-dropout", type=cli.PROBABILITY, default=0.0, help="dropout before the QQP head")
    g.add_argument("--sts-dropout", type=cli.PROBABILITY, default=0.1, help="dropout before the STS head")
    g.add_argument("--qqp-margin", type=MARGIN, default=0.7, help="h of the QQP hinge y = max(cos, h)")
    g.add_argument("--sts-margin", type=MARGIN, default=0.0, help="h of the STS y = max(cos, h)")
    g = p.add_argument_group("training")
    g.add_argument("--sst-batch-size", type=cli.AT_LEAST_1, default=32, help="SST sentences per step")
    g.add_argument("--qqp-batch-size", type=cli.AT_LEAST_1, default=96, help="QQP pairs per step")
    g.add_argument("--sts-batch-size", type=cli.AT_LEAST_1, default=32, help="STS pairs per step")
    g.add_argument("--sst-weight", type=cli.NON_NEGATIVE, default=5.0, help="weight of the SST loss in the sum")
    g.add_argument("--qqp-weight", type=cli.NON_NEGATIVE, default=20.0, help="weight of the QQP loss in the sum")
    g.add_argument("--sts-weight", type=cli.NON_NEGATIVE, default=1.0, help="weight of the STS loss in the sum")
    g.add_argument("--max-train-examples", type=cli.AT_LEAST_1, default=None,
                   help="use the first N rows of each training file")
    g.add_argument("--max-eval-examples", type=cli.AT_LEAST_1, default=None,
                   help="evaluate during training on the first N rows of each dev file (default all; "
                        "the final metrics.json always uses all)")
    g = p.add_argument_group("files (default: the standard CS224N names in --data-dir)")
    for task in TASKS:
        for split in SPLITS:
            g.add_argument(f"--{task}-{split}", default=None, metavar="FILE")
    g = p.add_argument_group("prediction")
    g.add_argument("--predict-only", action="store_true",
                   help="write predictions/ and metrics.json again from --checkpoint, without training")
    g.add_argument("--checkpoint", default=None,
                   help="--predict-only: a finished run directory (its best/) or a checkpoint directory; "
                        "its run's data settings are used unless given, and the files go to that run "
                        "directory unless --out-dir is given")
    cli.add_common_args(p, steps=5000, lr=1e-5, batch_size=128, eval_every=500, max_length=128, helps={
        "batch_size": "sentences per batch in evaluation and prediction (training: --sst/qqp/sts-batch-size)",
        "out_dir": "run directory (default runs/multitask-<encoder>-<time>, <encoder> the name of --encoder's "
                   "directory; --predict-only: the --checkpoint's run directory)"})
    cli.add_renamed_flags(p, {f"--para-{name}": f"--qqp-{name}"
                              for name in ("dropout", "margin", "batch-size", "weight", *SPLITS)})
    return p


# The settings --predict-only takes from the run's config.json unless given on the command line.
_PREDICT_SETTINGS = ("data_dir", "max_length", "batch_size", *(file_flag(t, s) for t in TASKS for s in SPLITS))


def parse(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.predict_only:
        if args.resume:
            raise UsageError("--predict-only and --resume exclude each other")
        if not args.checkpoint:
            raise UsageError("--predict-only needs --checkpoint DIR (a finished run directory)")
        config = run_dir_of(resolve_checkpoint(args.checkpoint)) / "config.json"
        if config.is_file():
            saved = json.loads(config.read_text())
            if isinstance(saved, dict) and "sst_train" in saved:  # a multitask run's settings
                saved = renamed_from_para(saved)
                parser.set_defaults(**{k: saved[k] for k in _PREDICT_SETTINGS if k in saved})
    elif args.checkpoint:
        raise UsageError("--checkpoint is for --predict-only (to start from a checkpoint, use --encoder)")
    return cli.parse_args(parser, argv, upgrade=renamed_from_para)


def fill_defaults(args) -> None:
    """--encoder defaults to --init, else --model; --out-dir to runs/multitask-<encoder>-<time>."""
    args.encoder = str(args.encoder or args.init or args.model)
    if args.out_dir is None and not args.predict_only:
        source = Path(str(resolve_encoder_source(args.encoder)))
        name = source.parent.name if source.name == "best" else source.name
        args.out_dir = runs.default_out_dir("multitask", name or "encoder")


def load_encoder(args) -> SentenceEncoder:
    kwargs = dict(pooling=args.pooling, vocab=args.vocab, hidden_dropout_prob=args.dropout,
                  attention_probs_dropout_prob=args.dropout)
    return SentenceEncoder.from_pretrained(resolve_encoder_source(args.encoder), **kwargs)


def effective_max_length(args, encoder) -> int:
    return min(args.max_length, encoder.bert.config.max_position_embeddings)


def predict_only(args) -> dict:
    checkpoint = resolve_checkpoint(args.checkpoint)
    out_dir = Path(args.out_dir) if args.out_dir else run_dir_of(checkpoint)
    model = MultitaskModel.from_pretrained(checkpoint, vocab=args.vocab).to(args.device)
    data = load_data(args, model.encoder.tokenizer, effective_max_length(args, model.encoder), splits=("dev", "test"))
    meta = {"checkpoint": str(checkpoint), "step": checkpoint_meta(checkpoint).get("step")}
    with runs.hold(out_dir):  # not into a run directory that a run is writing
        metrics = write_predictions(model, data, out_dir, args.batch_size, args.precision, meta)
    report(metrics, out_dir)
    return metrics


def report(metrics: dict, out_dir) -> None:
    print(f"dev: SST acc {metrics['sst_acc']:.4f}, QQP acc {metrics['qqp_acc']:.4f}, "
          f"STS r {metrics['sts_pearson']:.4f}, mean {metrics['mean_dev']:.4f}; "
          f"predictions in {Path(out_dir) / 'predictions'}")


def main(argv=None) -> dict:
    args = parse(argv)
    fill_defaults(args)
    args.command = cli.command_line("run_multitask.py", argv)
    if args.predict_only:
        return predict_only(args)
    with runs.hold(args.out_dir):  # one run per directory, from before anything is written
        check_files(args, why=fetch_data(args))
        return run_distributed(train, args)


def train(args, device) -> dict:
    check_files(args)  # fail on missing data before loading the (slow) model
    training.set_seed(args.seed)
    encoder = load_encoder(args)
    max_length = effective_max_length(args, encoder)
    encoder.max_length = max_length
    data = load_data(args, encoder.tokenizer, max_length)
    model = MultitaskModel(encoder, proj_dim=args.proj_dim, sst_dropout=args.sst_dropout,
                           qqp_dropout=args.qqp_dropout, sts_dropout=args.sts_dropout,
                           qqp_margin=args.qqp_margin, sts_margin=args.sts_margin)
    if args.freeze_encoder:
        encoder.requires_grad_(False)
    elif args.freeze_flow:
        for head in (encoder.flow, encoder.dense):
            if head is not None:
                head.requires_grad_(False)
    model.to(device)
    if args.compile:
        encoder.bert.compile_layers()

    train_sets = {t: data[t, "train"] for t in TASKS}
    dev_sets = {t: data[t, "dev"] for t in TASKS}
    batch_sizes = {"sst": args.sst_batch_size, "qqp": args.qqp_batch_size, "sts": args.sts_batch_size}
    weights = {"sst": args.sst_weight, "qqp": args.qqp_weight, "sts": args.sts_weight}
    multitask_loss = MultitaskLoss(weights, args.qqp_margin, args.sts_margin)
    samplers = make_samplers({t: len(d) for t, d in train_sets.items()}, args.seed)
    rank, world = dist_info()
    pad_id = encoder.tokenizer.pad_token_id
    step_model = wrap_ddp(model, device)

    def step_fn(step):
        rows = {task: samplers[task].next(batch_sizes[task])[local_rows(batch_sizes[task], rank, world)] for task in TASKS}
        inputs, labels = train_batch(train_sets, rows, pad_id, device)
        loss, parts = multitask_loss(step_model(**inputs), labels)
        return loss, {f"loss_{t}": parts[t].detach() for t in TASKS}

    def evaluate_fn(step):
        return evaluate(model, dev_sets, args.batch_size, args.precision, args.max_eval_examples)

    run = runs.Run(args.out_dir, vars(args), resume=args.resume)
    optimizer = training.make_optimizer(model.parameters(), args.lr, args.weight_decay, device)
    scheduler = training.make_scheduler(optimizer, args.lr_schedule, args.warmup_steps, args.steps)
    trainer = None

    def save_model(directory):
        model.save_pretrained(directory, extra={"step": trainer.step})

    items = args.sst_batch_size + 2 * args.qqp_batch_size + 2 * args.sts_batch_size
    trainer = training.Trainer(args, run, {"model": model}, optimizer, scheduler, samplers,
                               metric=SELECTION_METRIC, save_model=save_model, evaluate=evaluate_fn,
                               items_per_step=items, upgrade_state=renamed_from_para)
    if args.resume:
        trainer.resume()
    summary = trainer.fit(step_fn)
    if rank != 0:
        return summary
    if summary["interrupted"]:
        print(f"no predictions written (interrupted); continue with --resume --out-dir {run.dir}", file=sys.stderr)
        return summary
    best = MultitaskModel.from_pretrained(run.dir / "best", vocab=args.vocab).to(device)
    meta = {"checkpoint": str(run.dir / "best"), "step": checkpoint_meta(run.dir / "best").get("step")}
    summary["metrics"] = write_predictions(best, data, run.dir, args.batch_size, args.precision, meta)
    print(f"mean dev (during training): step 0 {summary['first']:.4f}, best {summary['best']:.4f} "
          f"at step {summary['best_step']}")
    report(summary["metrics"], run.dir)
    return summary


def command(argv=None) -> int:
    """``run_multitask.py`` and ``bertcf-multitask``: the command's exit status (bad input: one line, 2)."""
    return cli.run_main(main, argv)
