"""``run_multitask.py`` and ``bertcf-multitask``: multitask fine-tuning. Parses and resolves the
settings (``bertcf.multitask.config``), declares the tasks once (``declarations.declared_tasks``:
a task file is read here, and only here), checks the run (``checks.check_run``), then trains
(``trainer.MultitaskTrainer``) or, with --predict-only, writes a finished run's predictions again."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from .. import runs
from ..cli import run_main
from ..models.encoder import SentenceEncoder
from ..training.loop import set_seed
from ..utils.distributed import run_distributed
from .checks import check_run
from .config import MultitaskConfig, parse
from .data import check_files, fetch_data, load_data
from .declarations import declared_tasks
from .evaluation import summary_line, write_predictions
from .model import MultitaskModel, checkpoint_meta, resolve_checkpoint, run_dir_of
from .tasks import Task
from .trainer import MultitaskTrainer, effective_max_length


def run(argv=None) -> dict:
    """The run of ``argv``: its summary (with the final dev metrics), or --predict-only's metrics."""
    return run_config(parse(argv))


def main(argv=None) -> int:
    """The command's exit status (bad input: one line on stderr, 2)."""
    return run_main(run, argv)


def run_config(config: MultitaskConfig) -> dict:
    """The run of ``config``: --predict-only writes the predictions of a finished run again;
    otherwise fine-tuning, in the run directory it names (held: one run per directory)."""
    if config.predict_only:
        return predict_only(config)
    tasks = declared_tasks(config)  # a bad declaration is refused before anything is written
    check_run(config, tasks, declared=True)
    with runs.hold(config.out_dir):  # one run per directory, from before anything is written
        check_files(tasks, why=fetch_data(tasks, config.data_dir))
        return run_distributed(partial(train, tasks=tasks), config)


def load_encoder(config: MultitaskConfig) -> SentenceEncoder:
    return SentenceEncoder.from_pretrained(runs.resolve_encoder_path(config.encoder), pooling=config.pooling,
                                           vocab=config.vocab, hidden_dropout_prob=config.dropout,
                                           attention_probs_dropout_prob=config.dropout)


def train(config: MultitaskConfig, device, tasks: list[Task]) -> dict:
    """Fine-tuning on ``device`` (in each process under torchrun): the seed set before the encoder
    loads, as ``MultitaskTrainer`` from Python gives the same weights."""
    set_seed(config.seed)
    return MultitaskTrainer.of_declared(load_encoder(config), tasks, config).train(device)


def predict_only(config: MultitaskConfig) -> dict:
    checkpoint = resolve_checkpoint(config.checkpoint)
    out_dir = Path(config.out_dir) if config.out_dir else run_dir_of(checkpoint)
    model = MultitaskModel.from_pretrained(checkpoint, vocab=config.vocab).to(config.device)
    declared = {t.name: t for t in declared_tasks(config)}  # the files: the run's settings, or the flags
    tasks = [declared[name].replace(**_head_fields(task)) if name in declared else task
             for name, task in model.tasks.items()]
    data = load_data(tasks, model.encoder.tokenizer, effective_max_length(config, model.encoder),
                     splits=("dev", "test"), joint={name for name, head in model.heads.items() if head.joint})
    meta = {"checkpoint": str(checkpoint), "step": checkpoint_meta(checkpoint).get("step")}
    with runs.hold(out_dir):  # not into a run directory that a run is writing
        metrics = write_predictions(model, data, out_dir, config.batch_size, config.precision, meta,
                                    label_names=config.prediction_labels == "name", show=config.progress)
    print(summary_line(metrics, tasks, out_dir))
    return metrics


def _head_fields(task: Task) -> dict:
    """What a checkpoint's task declaration decides about its head and predictions (the rest,
    its files, comes from the run's settings)."""
    keep = ("kind", "num_classes", "labels", "label_range", "loss", "metric", "dropout", "margin")
    return {k: getattr(task, k) for k in keep}
