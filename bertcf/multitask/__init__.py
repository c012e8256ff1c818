"""Stage 3, multitask fine-tuning: one encoder trained on several declared tasks at once.

    from bertcf import SentenceEncoder, set_seed
    from bertcf.multitask import MultitaskTrainer, Task, builtin_tasks

    set_seed(11711)
    encoder = SentenceEncoder.from_pretrained("runs/mirror-run")
    tasks = list(builtin_tasks("data/").values()) + [
        Task("snli", "pair-classification", train="snli-train.tsv", dev="snli-dev.tsv",
             text_columns=("premise", "hypothesis"), num_classes=3, loss="softmax")]
    MultitaskTrainer(encoder, tasks, steps=1000, out_dir="runs/mt", task_sampling="proportional").fit()

The package, by concern: ``tasks`` (the declarations, task files), ``data`` (reading and
tokenising), ``heads`` (all that depends on a task's kind: a class per kind and pair encoding, its
layers, loss, predictions and views), ``model`` (the encoder and a head per task), ``legacy`` (what
older versions wrote: QQP's old name, checkpoints and runs from before tasks were declared),
``losses`` (the heads' loss functions), ``sampling`` (how tasks share the steps), ``weighting``,
``aggregation`` and ``smart`` (the multitask methods, ``methods`` combines them in a step), ``step``
(the step the trainer runs and the bench times), ``evaluation`` (metrics, prediction files),
``monitor`` (TensorBoard), ``config`` (the command's settings and their rules among themselves),
``checks`` (what a run refuses before it writes anything: ``check_run``), ``trainer`` (the step's
batches and the run) and ``command`` (the command: the tasks declared once, --predict-only).
"""
from .config import MultitaskConfig
from .model import MultitaskModel
from .tasks import KINDS, Task, builtin_tasks
from .trainer import MultitaskTrainer

__all__ = ["KINDS", "MultitaskConfig", "MultitaskModel", "MultitaskTrainer", "Task", "builtin_tasks"]
