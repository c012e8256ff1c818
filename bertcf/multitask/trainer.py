"""Multitask fine-tuning (``run_multitask.py``; the report's sections 4.3 and 5.3): the training step
and the run around it, from Python (``MultitaskTrainer``) and from the command (``run``).

Each step draws the batches of the tasks ``--task-sampling`` picks (every task by default: 32 SST
sentences, 96 QQP pairs, 32 STS pairs; each task's data cycles on its own), encodes all their
sentences in one pass, and minimises the weighted sum of the tasks' losses (5 L_sst + 20 L_qqp +
1 L_sts by default), or, with ``--aggregator``, combines the tasks' gradients on the encoder with
a torchjd aggregator; ``--task-weighting`` learns or adapts the weights and ``--smart-weight``
adds SMART's smoothness regulariser. With a flow or a linear head (``SentenceEncoder.dense``,
e.g. a whitening map), they are fine-tuned with the encoder unless frozen. Every --eval-every
steps the dev sets are scored and the checkpoint with the best mean of the tasks' dev metrics is
kept as ``best/``; at the end the best checkpoint writes the prediction files to ``predictions/``
and ``metrics.json``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from minbert import pad_batch

from .. import runs
from ..models.cross_encoder import pad_pairs
from ..models.encoder import SentenceEncoder
from ..training.loop import TrainingLoop, set_seed
from ..training.optim import make_optimizer, make_scheduler
from ..training.sampler import EpochSampler
from ..utils.distributed import dist_info, local_rows, run_distributed, wrap_ddp
from . import monitor
from .config import MultitaskConfig
from .data import check_files, fetch_data, load_data
from .evaluation import SELECTION_METRIC, evaluate, summary_line, write_predictions
from .losses import build_loss
from .methods import StepMethods
from .model import MultitaskModel, checkpoint_meta, renamed_from_para, resolve_checkpoint, run_dir_of
from .sampling import TaskSampler
from .tasks import Task, declared_tasks


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


class MultitaskTrainer:
    """Stage 3 from Python: ``encoder`` (a :class:`SentenceEncoder`) fine-tuned on ``tasks`` (a list
    of :class:`Task`; ``builtin_tasks(data_dir)`` gives the report's three) with the settings of
    ``config`` (a :class:`MultitaskConfig`) or keywords (``steps=1000, out_dir="runs/mt",
    task_sampling="proportional", aggregator="pcgrad", ...``: any ``run_multitask.py`` flag's
    name). ``fit()`` writes the run directory the command writes and returns its summary
    (``metrics``: the best checkpoint's dev metrics). With the same seed (``set_seed`` before the
    encoder is loaded) it gives the command's weights."""

    def __init__(self, encoder: SentenceEncoder, tasks: list[Task], config: MultitaskConfig | None = None,
                 **settings):
        config = MultitaskConfig(**settings) if config is None else config.replace(**settings)
        if config.out_dir is None:
            config = config.replace(out_dir=runs.default_out_dir("multitask", "python"))
        self.encoder, self.tasks, self.config = encoder, list(tasks), config.on_device()
        StepMethods.check(self.config, self.tasks, dist_info()[1])

    def fit(self) -> dict:
        with runs.hold(self.config.out_dir):
            check_files(self.tasks)
            return self.train(self.config.device)

    # ---- the run -------------------------------------------------------------------------------
    def build_model(self, device) -> MultitaskModel:
        """The encoder and a head per task, frozen as asked, on ``device``."""
        config, encoder = self.config, self.encoder
        model = MultitaskModel(encoder, self.tasks, config.proj_dim, config.pair_encoding)
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

    def train(self, device) -> dict:
        config, encoder = self.config, self.encoder
        max_length = effective_max_length(config, encoder)
        encoder.max_length = max_length
        data = load_data(self.tasks, encoder.tokenizer, max_length, pair_encoding=config.pair_encoding,
                         max_train_examples=config.max_train_examples)
        model = self.build_model(device)
        names = [t.name for t in self.tasks]
        train_sets = {t: data[t, "train"] for t in names}
        dev_sets = {t: data[t, "dev"] for t in names}
        samplers = make_samplers({t: len(d) for t, d in train_sets.items()}, config.seed)
        task_sampler = TaskSampler(config.task_sampling, {t: len(d) for t, d in train_sets.items()}, config.steps,
                                   config.seed, config.sampling_temperature)
        run = runs.Run(config.out_dir, config.to_dict() | {"declared_tasks": [t.to_dict() for t in self.tasks]},
                       resume=config.resume)
        methods = StepMethods(config, model)
        step = Step(config, model, wrap_ddp(model, device), train_sets, samplers, task_sampler, methods, run, device)
        optimizer = make_optimizer([*model.parameters(), *methods.parameters()], config.lr, config.weight_decay, device)
        scheduler = make_scheduler(optimizer, config.lr_schedule, config.warmup_steps, config.steps)
        loop = None

        def save_model(directory):
            model.save_pretrained(directory, extra={"step": loop.step})

        def evaluate_fn(step_number):
            metrics = evaluate(model, dev_sets, config.batch_size, config.precision, config.max_eval_examples)
            return metrics | {f"batches_{t}": n for t, n in task_sampler.counts.items()}

        loop = TrainingLoop(config, run, {"model": model, **methods.modules()}, optimizer, scheduler, samplers,
                            metric=SELECTION_METRIC, save_model=save_model, evaluate=evaluate_fn,
                            items_per_step=sum(t.batch_size * model.columns(t.name) for t in self.tasks),
                            extra_state={"task_sampler": task_sampler, **methods.extra_state()},
                            upgrade_state=upgrade_state)
        if config.resume:
            loop.resume()
        summary = loop.fit(step, backward=methods.backward if methods.custom_backward else None)
        rank, world = dist_info()
        if rank == 0:
            summary = self.finish(summary, run, data, dev_sets, device)
        if world > 1:  # the ranks leave the process group together, not while rank 0 still writes
            torch.distributed.barrier()
        return summary

    def finish(self, summary: dict, run: runs.Run, data: dict, dev_sets: dict, device) -> dict:
        """After training: the best checkpoint's predictions, metrics.json and TensorBoard views (not
        after a stop)."""
        config, run_dir = self.config, run.dir
        if summary["interrupted"]:
            print(f"no predictions written (interrupted); continue with --resume --out-dir {run_dir}", file=sys.stderr)
            return summary
        best = MultitaskModel.from_pretrained(run_dir / "best", vocab=config.vocab).to(device)
        meta = {"checkpoint": str(run_dir / "best"), "step": checkpoint_meta(run_dir / "best").get("step")}
        summary["metrics"] = write_predictions(best, data, run_dir, config.batch_size, config.precision, meta)
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(run_dir / "tb")) as writer:  # the best checkpoint's views beside the curves
            monitor.write_best_views(writer, best, dev_sets, meta["step"] or 0, config.batch_size, config.precision)
            monitor.write_hparams(writer, config.to_dict(), {k: v for k, v in summary["metrics"].items()
                                                             if isinstance(v, float)})
        print(f"mean dev (during training): step 0 {summary['first']:.4f}, best {summary['best']:.4f} "
              f"at step {summary['best_step']}")
        print(summary_line(summary["metrics"], self.tasks, run_dir))
        return summary


class Step:
    """One training step (the loop's ``step_fn``): the tasks the sampler picks, their batches in
    one encoder pass, their losses, combined as the methods say."""

    def __init__(self, config, model, step_model, train_sets, samplers, task_sampler, methods, run, device):
        self.config, self.model, self.step_model = config, model, step_model
        self.train_sets, self.samplers, self.task_sampler = train_sets, samplers, task_sampler
        self.methods, self.run, self.device = methods, run, device
        self.losses = {name: build_loss(task, config.pair_encoding) for name, task in model.tasks.items()}
        self.rank, self.world = dist_info()
        self.pad_id = model.encoder.tokenizer.pad_token_id

    def __call__(self, step: int):
        chosen = self.task_sampler.tasks_at(step)
        rows = {}
        for task in chosen:
            b = self.model.tasks[task].batch_size
            rows[task] = self.samplers[task].next(b)[local_rows(b, self.rank, self.world)]
        inputs, labels = train_batch(self.train_sets, rows, self.pad_id, self.device)
        out, features = self.step_model(**inputs, return_features=True)
        parts = {}
        for task, y in out.items():
            args = tuple(y) if isinstance(y, tuple) else (y,)  # a bi-encoded pair's two projections
            parts[task] = self.losses[task](*args, labels[task])
        if self.world == 1 and self.config.conflict_every and step % self.config.conflict_every == 0:
            self.log_conflicts(step, parts)
        loss, scalars = self.methods.combine(parts, features, inputs, out)
        scalars |= {f"loss_{t}": parts[t].detach() for t in chosen}
        scalars |= {f"batches_{t}": float(n) for t, n in self.task_sampler.counts.items()}
        return loss, scalars

    def log_conflicts(self, step: int, parts: dict) -> None:
        """The cosines between the tasks' gradients on the encoder (``monitor.gradient_cosines``)."""
        shared = monitor.shared_parameters(self.model)
        if len(parts) > 1 and shared:
            self.run.scalars(step, monitor.gradient_cosines(parts, shared), prefix="conflict/")


def upgrade_state(state: dict) -> dict:
    """A training state from before tasks were declared: QQP's old name; no task sampler yet (every
    task had a batch at every step)."""
    state = renamed_from_para(state)
    state.setdefault("extra", {}).setdefault("task_sampler", {"counts": dict.fromkeys(state["samplers"], state["step"])})
    return state


# ---- the command -------------------------------------------------------------------------------------
def run(config: MultitaskConfig) -> dict:
    """The run of ``config``: --predict-only writes the predictions of a finished run again;
    otherwise fine-tuning, in the run directory it names (held: one run per directory)."""
    if config.predict_only:
        return predict_only(config)
    tasks = declared_tasks(config)  # a bad declaration is refused before anything is written
    StepMethods.check(config, tasks, dist_info()[1])
    with runs.hold(config.out_dir):  # one run per directory, from before anything is written
        check_files(tasks, why=fetch_data(tasks, config.data_dir))
        return run_distributed(command_train, config)


def command_train(config: MultitaskConfig, device) -> dict:
    set_seed(config.seed)
    return MultitaskTrainer(load_encoder(config), declared_tasks(config), config).train(device)


def predict_only(config: MultitaskConfig) -> dict:
    checkpoint = resolve_checkpoint(config.checkpoint)
    out_dir = Path(config.out_dir) if config.out_dir else run_dir_of(checkpoint)
    model = MultitaskModel.from_pretrained(checkpoint, vocab=config.vocab).to(config.device)
    declared = {t.name: t for t in declared_tasks(config)}  # the files: the run's settings, or the flags
    tasks = [declared[name].replace(**_head_fields(task)) if name in declared else task
             for name, task in model.tasks.items()]
    data = load_data(tasks, model.encoder.tokenizer, effective_max_length(config, model.encoder),
                     splits=("dev", "test"), pair_encoding=model.pair_encoding)
    meta = {"checkpoint": str(checkpoint), "step": checkpoint_meta(checkpoint).get("step")}
    with runs.hold(out_dir):  # not into a run directory that a run is writing
        metrics = write_predictions(model, data, out_dir, config.batch_size, config.precision, meta)
    print(summary_line(metrics, tasks, out_dir))
    return metrics


def _head_fields(task: Task) -> dict:
    """What a checkpoint's task declaration decides about its head and predictions (the rest,
    its files, comes from the run's settings)."""
    keep = ("kind", "num_classes", "labels", "label_range", "loss", "metric", "dropout", "margin")
    return {k: getattr(task, k) for k in keep}
