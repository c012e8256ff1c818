"""``Trainer``: an objective trained on examples, by the settings of a ``TrainConfig``, into a run
directory (config.json, metrics.jsonl, TensorBoard, best/, last/, --resume): what
``run_pretrain.py`` runs, and what a script or a notebook runs the same way.

    set_seed(11711)
    encoder = SentenceEncoder.from_pretrained("bert-base-uncased")
    objective = objectives.SimCSE(encoder, temperature=0.05)
    Trainer(objective, sentences, TrainConfig(steps=1000, out_dir="runs/simcse"),
            evaluator=STSDevEvaluator(read_sts("data/sts-dev.csv"))).fit()
"""
from __future__ import annotations

import torch

from minbert import pad_batch
from minbert.model import load_state_dict_file

from .. import runs
from ..config.train import TrainConfig
from ..data.examples import Examples
from ..utils.distributed import dist_info, wrap_ddp
from ..utils.files import recover_dir
from .loop import TrainingLoop
from .optim import make_optimizer, make_scheduler
from .sampler import EpochSampler, NoDuplicatesSampler

#: Held-out sentences for an objective's own metrics (MLM's accuracy), at most this many.
HELDOUT_SENTENCES = 512


class GeneratorState:
    """Makes a torch.Generator's state part of a checkpoint (the objective's random choices)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self):
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state):
        self.generator.set_state(state["state"])


class Trainer:
    """Train ``objective`` (an ``objectives.Objective``, which owns the encoder) on ``data``.

    - ``data``: an ``Examples`` (columns of sentences and labels) or a list of sentences (a corpus);
    - ``config``: a ``TrainConfig`` (steps, batch, lr, schedule, precision, evaluation, seed,
      ``out_dir``, ``resume``); a command's larger config (every field of TrainConfig) is one too;
    - ``evaluator``: called on the encoder at every evaluation, returning metrics (an
      ``evaluation`` object such as ``STSDevEvaluator``); its ``main_metric`` picks best/ unless
      ``metric`` names another ("last_step": the latest evaluation). Without one, best/ is the last;
    - ``heldout``: sentences for the objective's own metrics (MLM's held-out accuracy);
    - ``record``: what config.json records (default: the config and the objective's settings).

    The Trainer seeds the objective's generator with ``config.seed``; the modules' initial
    weights are drawn when they are built, so seed first (``set_seed``) for a run that repeats.
    ``fit()`` returns the summary: step, first and best score, best step, whether interrupted."""

    def __init__(self, objective, data, config: TrainConfig | None = None, evaluator=None, *, metric: str | None = None,
                 heldout: list[str] | None = None, record: dict | None = None):
        self.objective = objective
        self.examples = data if isinstance(data, Examples) else Examples([list(data)])
        self.config = (config or TrainConfig()).on_device()
        if self.config.out_dir is None:
            self.config = self.config.replace(out_dir=runs.default_out_dir("train", type(objective).__name__.lower()))
        self.evaluator = evaluator
        self.metric = metric or getattr(evaluator, "main_metric", None) or "last_step"
        self.heldout = heldout or []
        self.record = record if record is not None else self.config.to_dict() | objective.description()

    @property
    def encoder(self):
        return self.objective.encoder

    def _broadcast_out_dir(self, world: int) -> None:
        """Under torchrun every rank takes rank 0's --out-dir (a default one names the time)."""
        if world > 1:
            out_dir = [self.config.out_dir]
            torch.distributed.broadcast_object_list(out_dir, src=0)
            self.config = self.config.replace(out_dir=out_dir[0])

    def _batches(self):
        """The step's inputs: rows of the examples as padded ids, mask and special-token mask."""
        tokenizer = self.encoder.tokenizer
        columns = [tokenizer(c, truncation=True, max_length=self.config.max_length)["input_ids"]
                   for c in self.examples.columns]
        special_ids = torch.tensor(tokenizer.all_special_ids)

        def batch(ids_list):
            ids, mask = pad_batch(ids_list, tokenizer.pad_token_id)
            return ids, mask, torch.isin(ids, special_ids) | (mask == 0)
        return columns, batch

    def fit(self, device=None) -> dict:
        """Train (or, with ``config.resume``, continue) the run; ``device``: this process's (under
        torchrun, its GPU), default ``config.device``."""
        rank, world = dist_info()
        self._broadcast_out_dir(world)
        config, objective, examples = self.config, self.objective, self.examples
        if not config.resume:
            objective.generator.manual_seed(config.seed)
        device = torch.device(device or config.device)
        objective.to(device)
        columns, batch = self._batches()
        sampler = self._sampler()
        if config.compile:  # minBERT layer by layer, in place, so evaluation runs compiled too
            self.encoder.bert.compile_layers()
        # What the step calls: under torchrun a DistributedDataParallel wrapper (gradients averaged
        # over ranks); in one process the objective itself, which evaluation and checkpoints use.
        step_objective = wrap_ddp(objective, device)

        def step_fn(step):
            # The global batch, padded as one process would pad it; every rank draws the same. Its
            # columns (pairs, triples) are stacked: column j in rows j*B .. (j+1)*B - 1.
            rows = sampler.next(config.batch_size)
            extra = {"texts": [examples.columns[0][i] for i in rows]} if objective.needs_text else {}
            if examples.labels is not None:
                extra["labels"] = examples.labels[torch.tensor(rows)]
            return step_objective(*batch([c[i] for c in columns for i in rows]), rank=rank, world=world, **extra)

        run = runs.Run(config.out_dir, self.record, resume=config.resume)
        loop = TrainingLoop(config, run, objective.checkpoint_modules(),
                            *self._optimizer(device), {"corpus": sampler}, metric=self.metric,
                            save_model=self._saver(run), evaluate=self._evaluation(run, batch),
                            items_per_step=config.batch_size, extra_state={"span": GeneratorState(objective.generator)})
        if config.resume:
            if objective.encoder_frozen:  # the encoder as this run used it, whatever --init holds now
                last = recover_dir(run.dir / "last")
                self.encoder.bert.load_hf_state_dict(load_state_dict_file(last / "model.safetensors"), source=str(last))
            loop.resume()
        return loop.fit(step_fn, after_step=objective.after_step)

    def _sampler(self):
        """The data order: ``config.batch_sampler``, by default the objective's (``no_duplicates``)."""
        kind = self.config.batch_sampler or ("no-duplicates" if self.objective.no_duplicates else "random")
        if kind == "no-duplicates":
            return NoDuplicatesSampler(list(zip(*self.examples.columns)), seed=self.config.seed)
        return EpochSampler(len(self.examples), seed=self.config.seed)

    def _optimizer(self, device):
        optimizer = make_optimizer(self.objective.parameter_groups(), self.config.lr, self.config.weight_decay, device)
        return optimizer, make_scheduler(optimizer, self.config.lr_schedule, self.config.warmup_steps,
                                         self.config.steps)

    def _evaluation(self, run, batch):
        """evaluate(step) of the loop (rank 0 only; the other ranks wait at a barrier): the evaluator
        and the objective's own metrics on the held-out sentences."""
        tokenizer = self.encoder.tokenizer
        heldout = batch(tokenizer(self.heldout[:HELDOUT_SENTENCES], truncation=True,
                                  max_length=self.config.max_length)["input_ids"]) if self.heldout else None

        def evaluate(step):
            result = self.evaluator(self.encoder) if self.evaluator is not None else {}
            if heldout is not None:
                result |= self.objective.heldout_metrics(*heldout)
            if "cosines" in result:
                run.histogram(step, "eval/sts_dev_cosines", result.pop("cosines"))
            return result | ({"last_step": step} if self.metric == "last_step" else {})  # the latest is the best
        return evaluate

    def _saver(self, run):
        def save_model(directory):
            """The encoder (and flow) checkpoint. A frozen encoder never changes during the run, so
            once a checkpoint of it exists its weights are hard-linked rather than written again at
            every evaluation (twice: last/ and best/)."""
            written = [d / "model.safetensors" for d in (run.dir / "last", run.dir / "best")]
            reuse = next((f for f in written if f.is_file()), None) if self.objective.encoder_frozen else None
            self.encoder.save_pretrained(directory, link_weights_from=reuse)
        return save_model
