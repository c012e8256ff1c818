"""Training machinery shared by every training run: an objective's ``Trainer`` (the Python API and
``run_pretrain.py``), the loop under it and multitask fine-tuning (``TrainingLoop``), the optimiser
and its schedule, the data order and the seeds."""
from .loop import TrainingLoop, set_seed
from .optim import make_optimizer, make_scheduler, update
from .sampler import EpochSampler, TaskSampler
from .trainer import Trainer

__all__ = ["EpochSampler", "TaskSampler", "Trainer", "TrainingLoop", "make_optimizer", "make_scheduler", "set_seed",
           "update"]
