"""Training machinery shared by every training command: the loop (``Trainer``), the optimiser and
its schedule, the data order and the seeds."""
from .optim import make_optimizer, make_scheduler, update
from .sampler import EpochSampler
from .trainer import Trainer, set_seed

__all__ = ["EpochSampler", "Trainer", "make_optimizer", "make_scheduler", "set_seed", "update"]
