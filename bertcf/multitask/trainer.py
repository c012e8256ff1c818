"""Multitask fine-tuning (``run_multitask.py``; the report's sections 4.3 and 5.3): the training step
and the run around it (``MultitaskTrainer``), from Python and from the command (``command``).

Each step draws the batches of the tasks ``--task-sampling`` picks (every task by default: 32 SST
sentences, 96 QQP pairs, 32 STS pairs; each task's data cycles on its own), encodes all their
sentences in one pass, and minimises the weighted sum of the tasks' losses (5 L_sst + 20 L_qqp +
1 L_sts by default), or, with ``--aggregator``, combines the tasks' gradients on the encoder with
a torchjd aggregator; ``--task-weighting`` learns or adapts the weights and ``--smart-weight``
adds SMART's smoothness regulariser. With a flow or a linear head (``SentenceEncoder.dense``,
e.g. a whitening map), they are fine-tuned with the encoder unless frozen. Every --eval-every
steps the dev sets are scored (``--max-eval-examples N``: a fixed random draw of N rows of each,
so that evaluating fits a short run) and the checkpoint with the best mean of the tasks' dev
metrics is kept as ``best/``; at the end the best checkpoint scores every dev and test row once,
for the prediction files in ``predictions/``, ``metrics.json`` and TensorBoard's views. The run
says what its evaluations will cost before it starts, and each phase after training in a line.
"""
from __future__ import annotations

import shutil
import time
from functools import partial
from pathlib import Path

from minbert import pad_batch

from .. import runs
from ..models.cross_encoder import pad_pairs
from ..models.encoder import SentenceEncoder
from ..models.peft import budget, budget_line, check_targets
from ..training.loop import TrainingLoop, closing_line, evaluation_steps
from ..training.sampler import EpochSampler, TaskSampler
from ..utils.distributed import dist_info, local_rows, wrap_ddp
from ..utils.files import save_dir_atomic
from ..utils.progress import clock, note
from . import monitor
from .checks import check_run, check_state_kept, check_task_list
from .config import MultitaskConfig
from .data import check_files, load_data
from .evaluation import SELECTION_METRIC, evaluate, final_sets, score, sentences, summary_line, write_predictions
from .heads import head_type
from .legacy import upgrade_state
from .methods import StepMethods
from .model import MultitaskModel, checkpoint_meta
from .step import step_losses
from .tasks import Task


def train_batch(train_sets: dict, rows: dict, pad_token_id: int, device, label_tensors: dict) -> tuple[dict, dict]:
    """The inputs of one step, ``rows`` (task -> row indices) of each task's training set:
    (keyword arguments of :meth:`MultitaskModel.forward`, labels per task [len(rows)], from
    ``label_tensors``: task -> its training set's labels as its head takes them).
    Every sentence of the step goes into one batch, padded to its longest sentence; the number
    of real tokens is counted here, on the host, so the unpadded encoder needs no GPU sync."""
    sentences, types, labels = [], [], {}
    for task, task_rows in rows.items():
        data = train_sets[task]
        for column in data.tokens:
            sentences += [column[i] for i in task_rows]
            types += [[] if data.token_types is None else data.token_types[i] for i in task_rows]
        labels[task] = label_tensors[task][task_rows].to(device, non_blocking=True)
    ids, mask = pad_batch(sentences, pad_token_id)
    inputs = {"input_ids": ids.to(device, non_blocking=True), "attention_mask": mask.to(device, non_blocking=True),
              "sizes": {task: len(task_rows) for task, task_rows in rows.items()}, "num_tokens": int(mask.sum())}
    if any(types):  # jointly encoded pairs: their token types (0 everywhere else)
        inputs["token_type_ids"] = pad_pairs(sentences, types, pad_token_id)[1].to(device, non_blocking=True)
    return inputs, labels


def joint_tasks(tasks: list[Task], pair_encoding: str) -> set[str]:
    """The tasks whose pairs are tokenised together (their heads read a pair jointly)."""
    return {t.name for t in tasks if head_type(t, pair_encoding).joint}


def make_samplers(sizes: dict, seed: int) -> dict:
    """One ``EpochSampler`` per task, each with its own seed, so every task's data cycles (and
    reshuffles) independently of the others."""
    return {task: EpochSampler(n, seed=seed + 1009 * i) for i, (task, n) in enumerate(sizes.items())}


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
        self._start(encoder, check_task_list(tasks), config.on_device(), declared=False)

    @classmethod
    def of_declared(cls, encoder: SentenceEncoder, tasks: list[Task], config: MultitaskConfig) -> "MultitaskTrainer":
        """The command's trainer: ``tasks`` are those ``config`` declares (``declarations.declared_tasks``,
        read once by the command), so that --tasks may leave out a built-in task that its flags set."""
        trainer = cls.__new__(cls)
        trainer._start(encoder, tasks, config.on_device(), declared=True)
        return trainer

    def _start(self, encoder: SentenceEncoder, tasks: list[Task], config: MultitaskConfig, declared: bool) -> None:
        self.encoder, self.tasks, self.config = encoder, tasks, config
        check_run(config, tasks, declared)
        if config.peft:
            check_targets(encoder.bert, config.target_modules)

    def fit(self, device=None) -> dict:
        """Train (or, with ``resume``, continue) the run; ``device``: default the config's."""
        with runs.hold(self.config.out_dir):
            check_files(self.tasks)
            return self.train(device or self.config.device)

    # ---- the run -------------------------------------------------------------------------------
    def build_model(self, device) -> MultitaskModel:
        """The encoder and a head per task, frozen as asked, on ``device``."""
        config, encoder = self.config, self.encoder
        if config.drop_flow:  # before the heads are built: they take the width of f(x)
            encoder.flow = encoder.dense = None
        model = MultitaskModel(encoder, self.tasks, config.proj_dim, config.pair_encoding)
        if config.peft:  # BERT's weights frozen, adapters trained (models/peft.py; after the heads' draws)
            model.add_adapters(config)
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
        data = load_data(self.tasks, encoder.tokenizer, max_length, joint=joint_tasks(self.tasks, config.pair_encoding),
                         max_train_examples=config.max_train_examples)
        model = self.build_model(device)
        names = [t.name for t in self.tasks]
        train_sets = {t: data[t, "train"] for t in names}
        dev_sets = {t: data[t, "dev"] for t in names}
        samplers = make_samplers({t: len(d) for t, d in train_sets.items()}, config.seed)
        task_sampler = TaskSampler(config.task_sampling, {t: len(d) for t, d in train_sets.items()}, config.steps,
                                   config.seed, config.sampling_temperature)
        # A resumed run's record is written once its checkpoint has loaded (below): a state that does
        # not load leaves config.json and environment.json as they were.
        run = runs.Run(config.out_dir, config.to_dict() | {"declared_tasks": [t.to_dict() for t in self.tasks]},
                       resume=config.resume)
        methods = StepMethods(config, model)
        step = Step(config, model, wrap_ddp(model, device), train_sets, samplers, task_sampler, methods, run, device)
        loop = None

        def save_model(directory):
            model.save_pretrained(directory, extra={"step": loop.step})

        def evaluate_fn(step_number):
            metrics = evaluate(model, dev_sets, config.batch_size, config.precision, config.max_eval_examples,
                               config.progress, f"{run.dir.name}: evaluate step {step_number}")
            return metrics | {f"batches_{t}": n for t, n in task_sampler.counts.items()}

        # the sentences a batch of each task holds: the steps that draw one task count only its own
        by_task = {t.name: t.batch_size * model.rows_per_example(t.name) for t in self.tasks}
        # What scoring costs, in sentences: an evaluation's (a sample with --max-eval-examples), and the end's
        per_evaluation = sum(sentences(d.labeled(config.max_eval_examples)) for d in dev_sets.values())
        at_end = sum(sentences(d) for d in final_sets(data).values())
        loop = TrainingLoop(config, run, {"model": model, **methods.modules()},
                            [*model.parameters(), *methods.parameters()], samplers,
                            metric=SELECTION_METRIC, save_model=save_model, evaluate=evaluate_fn,
                            items_per_step=lambda: sum(n * by_task[t] for t, n in task_sampler.counts.items()),
                            extra_state={"task_sampler": task_sampler, **methods.extra_state()},
                            upgrade_state=upgrade_state, finish_cost=at_end / per_evaluation)
        if config.resume:
            check_state_kept(run.dir, config)
            loop.resume()
        step.budget = budget(model, loop.optimizer)
        if dist_info()[0] == 0:
            note(config.progress, f"{run.dir.name}: {budget_line(step.budget, encoder.adapters)}")
            at = [s for s in evaluation_steps(config.steps, config.eval_every) if s > loop.step or s == loop.step == 0]
            note(config.progress, evaluation_plan(run.dir.name, config, at, per_evaluation, at_end))
        return loop.fit(step, backward=methods.backward,
                        finish=lambda summary: self.finish(summary, run, data, dev_sets, device))

    def finish(self, summary: dict, run: runs.Run, data: dict, dev_sets: dict, device) -> dict:
        """After training: the best checkpoint scores every dev and test row once, for its
        predictions, metrics.json and TensorBoard views; then last/ keeps what --keep-last says
        (the loop calls it only after a run that was not stopped). Each phase says so in a line
        (``--progress``)."""
        config, run_dir = self.config, run.dir
        started = time.perf_counter()

        def say(text, timed=True):
            took = f" ({clock(time.perf_counter() - started)} since training ended)" if timed else ""
            note(config.progress, f"{run_dir.name}: {text}{took}")

        best = MultitaskModel.from_pretrained(run_dir / "best", vocab=config.vocab).to(device)
        meta = {"checkpoint": str(run_dir / "best"), "step": checkpoint_meta(run_dir / "best").get("step")}
        sets = final_sets(data)
        projector = [(t, "dev") for t in dev_sets if best.heads[t].projector]
        say(f"training done; the best checkpoint (step {meta['step']}) scores every dev and test row: "
            f"{sum(map(sentences, sets.values())):,} sentences", timed=False)
        outputs, vectors = score(best, sets, config.batch_size, config.precision, config.progress,
                                 f"{run_dir.name}: score step {meta['step']}", vectors_of=projector)
        summary["metrics"] = write_predictions(best, data, run_dir, config.batch_size, config.precision, meta, outputs,
                                               label_names=config.prediction_labels == "name")
        say(f"predictions and metrics.json written to {run_dir}")
        if config.merge:  # best was loaded with its adapter merged (SentenceEncoder.from_pretrained)
            save_dir_atomic(run_dir / "merged", lambda tmp: best.save_pretrained(tmp, extra={"step": meta["step"]}))
            say(f"{run_dir / 'merged'} written: the best checkpoint with its adapter merged (--merge)")
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(run_dir / "tb")) as writer:  # the best checkpoint's views beside the curves
            monitor.write_best_views(writer, best, dev_sets, meta["step"] or 0, config.batch_size, config.precision,
                                     {t: outputs[t, "dev"] for t in dev_sets}, {t: v for (t, _), v in vectors.items()})
            monitor.write_hparams(writer, config.to_dict(), {k: v for k, v in summary["metrics"].items()
                                                             if isinstance(v, float)})
        curves = [t for t in dev_sets if best.heads[t].pr_curve]
        views = ([f"the projector ({', '.join(t for t, _ in projector)})"] * bool(projector)
                 + [f"PR curves ({', '.join(curves)})"] * bool(curves) + ["HParams"])
        say(f"TensorBoard: {', '.join(views)} written to {run_dir / 'tb'}")
        if config.keep_last != "state":
            keep_last(run_dir, config.keep_last)
            say(f"last/ {'removed' if config.keep_last == 'none' else 'keeps its weights alone'} "
                f"(--keep-last {config.keep_last})", timed=False)
        print(closing_line(summary, "mean dev (during training)", run_dir, device))
        print(summary_line(summary["metrics"], self.tasks, run_dir))
        return summary


class Step:
    """One training step's losses (the loop's ``step_fn``; ``multitask.step``): the tasks the
    sampler picks, their batches, and ``step_losses`` on them; the loop's update is
    ``StepMethods.backward``."""

    def __init__(self, config, model, step_model, train_sets, samplers, task_sampler, methods, run, device):
        self.config, self.model, self.step_model = config, model, step_model
        self.train_sets, self.samplers, self.task_sampler = train_sets, samplers, task_sampler
        self.methods, self.run, self.device = methods, run, device
        self.rank, self.world = dist_info()
        self.pad_id = model.encoder.tokenizer.pad_token_id
        self.labels = {t: model.heads[t].label_tensor(d.labels) for t, d in train_sets.items()}  # once, not per step
        self.budget = {}  # models.peft.budget: parameters, trainable ones, the optimiser's state

    def __call__(self, step: int):
        chosen = self.task_sampler.tasks_at(step)
        rows = {}
        for task in chosen:
            b = self.model.tasks[task].batch_size
            rows[task] = self.samplers[task].next(b)[local_rows(b, self.rank, self.world)]
        inputs, labels = train_batch(self.train_sets, rows, self.pad_id, self.device, self.labels)
        conflicts = self.world == 1 and self.config.conflict_every and step % self.config.conflict_every == 0
        losses, scalars = step_losses(self.model, self.methods, inputs, labels, self.step_model,
                                      conflicts=partial(self.log_conflicts, step) if conflicts else None)
        scalars |= {f"batches_{t}": float(n) for t, n in self.task_sampler.counts.items()}
        scalars |= self.budget  # what training costs, in TensorBoard beside the losses (constant)
        return losses, scalars

    def log_conflicts(self, step: int, task_losses: dict) -> None:
        """The cosines between the tasks' gradients on the encoder (``monitor.gradient_cosines``)."""
        cosines = monitor.task_conflicts(self.model, task_losses)
        if cosines:
            self.run.scalars(step, cosines, prefix="conflict/")


def evaluation_plan(name: str, config: MultitaskConfig, at: list[int], per_evaluation: int, at_end: int) -> str:
    """The line a run starts with: what its evaluations will score, in sentences (``at``: the steps
    it evaluates at), so that a short run, whose time goes mostly there, says so before it starts."""
    sample = (f"a sample, --max-eval-examples {config.max_eval_examples} rows a task" if config.max_eval_examples
              else "every dev row; --max-eval-examples N scores a sample")
    when = ", ".join(map(str, at)) if len(at) <= 4 else f"{at[0]} to {at[-1]} every {config.eval_every}"
    during = f"evaluates at steps {when} ({per_evaluation:,} sentences each: {sample}); " if at else ""
    return (f"{name}: {config.steps} steps; {during}at the end the best checkpoint scores every dev and test row "
            f"({at_end:,} sentences)")


def keep_last(run_dir: Path, keep: str) -> None:
    """--keep-last: what a finished run's last/ keeps (``state``: all of it; ``weights``: not the
    training state, about three times the weights' size; ``none``: nothing)."""
    last = run_dir / "last"
    if keep == "none":
        shutil.rmtree(last, ignore_errors=True)
    elif keep == "weights":
        (last / runs.STATE_FILE).unlink(missing_ok=True)
