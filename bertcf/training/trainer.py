"""``Trainer``: an objective trained on examples (or a ``Mixture`` of objectives on their
datasets), by the settings of a ``TrainConfig``, into a run
directory (config.json, metrics.jsonl, TensorBoard, best/, last/, --resume): what
``run_pretrain.py`` runs, and what a script or a notebook runs the same way.

    set_seed(11711)
    encoder = SentenceEncoder.from_pretrained("bert-base-uncased")
    objective = objectives.SimCSE(encoder, temperature=0.05)
    Trainer(objective, sentences, evaluator=STSDevEvaluator(read_sts("data/sts-dev.csv")),
            steps=1000, out_dir="runs/simcse").fit()
"""
from __future__ import annotations

import torch

from minbert import pad_batch
from minbert.model import load_state_dict_file

from .. import runs
from ..config.pretrain import MIX_SAMPLINGS
from ..config.train import TrainConfig, default_batch_sampler
from ..data.examples import Examples
from ..errors import UsageError
from ..utils.distributed import dist_info, wrap_ddp
from ..utils.files import recover_dir
from .loop import TrainingLoop
from .sampler import EpochSampler, NoDuplicatesSampler, TaskSampler

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
      for an ``objectives.Mixture``, a dict of them keyed as its parts, and ``mix_sampling``
      (proportional or round-robin) says which one each step draws from;
    - ``config``: a ``TrainConfig`` (steps, batch, lr, schedule, precision, evaluation, seed,
      ``out_dir``, ``resume``); a command's larger config (every field of TrainConfig) is one too;
      ``settings``: its fields as keywords (``steps=1000, out_dir="runs/simcse"``), over ``config``;
    - ``evaluator``: called on the encoder at every evaluation, returning metrics (an
      ``evaluation`` object such as ``STSDevEvaluator``); its ``main_metric`` picks best/ unless
      ``metric`` names another ("last_step": the latest evaluation). Without one, best/ is the last;
    - ``heldout``: sentences for the objective's own metrics (MLM's held-out accuracy);
    - ``record``: what config.json records (default: the config and the objective's settings).

    The Trainer seeds the objective's generators with ``config.seed``; the modules' initial
    weights are drawn when they are built, so seed first (``set_seed``) for a run that repeats.
    ``fit()`` returns the summary: step, first and best score, best step, whether interrupted."""

    def __init__(self, objective, data, config: TrainConfig | None = None, evaluator=None, *, metric: str | None = None,
                 heldout: list[str] | None = None, record: dict | None = None, mix_sampling: str = "proportional",
                 **settings):
        self.objective = objective
        self.mixture = hasattr(objective, "parts")
        self.datasets = ({name: as_examples(d) for name, d in data.items()} if self.mixture else
                         {"corpus": as_examples(data)})  # "corpus": the data order's name in checkpoints
        if self.mixture and set(self.datasets) != set(objective.parts):
            raise UsageError(f"the mixture's parts ({', '.join(objective.parts)}) and datasets "
                             f"({', '.join(self.datasets)}) must have the same names")
        # A command's config comes resolved (``TrainConfig.resolved``) and stays as it is; a Python
        # user's gets the same defaults, in the same place, so config.json records what runs.
        config = TrainConfig(**settings) if config is None else config.replace(**settings) if settings else config
        self.config = config.resolved(
            ("train", type(objective).__name__.lower()), None if self.mixture else objective.no_duplicates)
        self.evaluator = evaluator
        self.metric = metric or getattr(evaluator, "main_metric", None) or "last_step"
        self.heldout = heldout or []
        if self.mixture and mix_sampling not in MIX_SAMPLINGS:  # the samplings that pick one part a step
            raise UsageError(f"a mixture's sampling is one of {', '.join(MIX_SAMPLINGS)}, not {mix_sampling!r}")
        self.mix_sampling = mix_sampling
        self.record = record if record is not None else self.config.to_dict() | objective.description()

    @property
    def encoder(self):
        return self.objective.encoder

    def part(self, name: str):
        """The objective that trains on dataset ``name``."""
        return self.objective.parts[name] if self.mixture else self.objective

    def _broadcast_out_dir(self, world: int) -> None:
        """Under torchrun every rank takes rank 0's --out-dir (a default one names the time)."""
        if world > 1:
            out_dir = [self.config.out_dir]
            torch.distributed.broadcast_object_list(out_dir, src=0)
            self.config = self.config.replace(out_dir=out_dir[0])

    def _batch(self, ids_list):
        """Padded ids, mask and special-token mask [b, t] of token-id lists."""
        tokenizer = self.encoder.tokenizer
        ids, mask = pad_batch(ids_list, tokenizer.pad_token_id)
        return ids, mask, torch.isin(ids, torch.tensor(tokenizer.all_special_ids)) | (mask == 0)

    def _samplers(self) -> dict:
        """Each dataset's data order (``config.batch_sampler``; a mixture's, when it asks for none,
        each part's own default), and a mixture's choice of dataset (``mixture``)."""
        samplers = {}
        for i, (name, examples) in enumerate(self.datasets.items()):
            kind = self.config.batch_sampler or default_batch_sampler(self.part(name).no_duplicates)
            seed = self.config.seed + 7919 * i
            samplers[name] = (NoDuplicatesSampler(list(zip(*examples.columns)), seed) if kind == "no-duplicates"
                              else EpochSampler(len(examples), seed))
        if self.mixture:
            samplers["mixture"] = TaskSampler(self.mix_sampling, {n: len(e) for n, e in self.datasets.items()},
                                              self.config.steps, self.config.seed)
        return samplers

    def fit(self, device=None) -> dict:
        """Train (or, with ``config.resume``, continue) the run; ``device``: this process's (under
        torchrun, its GPU), default ``config.device``."""
        rank, world = dist_info()
        self._broadcast_out_dir(world)
        config, objective = self.config, self.objective
        generators = objective.generators()
        if not config.resume:
            for i, generator in enumerate(generators.values()):
                generator.manual_seed(config.seed + 1009 * i)
        device = torch.device(device or config.device)
        objective.to(device)
        self.encoder.matryoshka_dims = trained_widths(objective, self.encoder.matryoshka_dims)
        columns = {name: [self.encoder.tokenizer(c, truncation=True, max_length=config.max_length)["input_ids"]
                          for c in examples.columns] for name, examples in self.datasets.items()}
        samplers = self._samplers()
        if config.compile:  # minBERT layer by layer, in place, so evaluation runs compiled too
            self.encoder.bert.compile_layers()
        # What the step calls: under torchrun a DistributedDataParallel wrapper (gradients averaged
        # over ranks); in one process the objective itself, which evaluation and checkpoints use.
        step_objective = wrap_ddp(objective, device)

        def step_fn(step):
            # The global batch, padded as one process would pad it; every rank draws the same. Its
            # columns (pairs, triples) are stacked: column j in rows j*B .. (j+1)*B - 1.
            name = samplers["mixture"].tasks_at(step)[0] if self.mixture else "corpus"
            examples, rows = self.datasets[name], samplers[name].next(config.batch_size)
            extra = {"dataset": name} if self.mixture else {}
            if self.part(name).needs_text:
                extra["texts"] = [examples.columns[0][i] for i in rows]
            if examples.labels is not None:
                extra["labels"] = examples.labels[torch.tensor(rows)]
            ids = self._batch([c[i] for c in columns[name] for i in rows])
            return step_objective(*ids, rank=rank, world=world, **extra)

        run = runs.Run(config.out_dir, self.record, resume=config.resume)
        loop = TrainingLoop(config, run, objective.checkpoint_modules(), objective.parameter_groups(), samplers,
                            metric=self.metric, save_model=self._saver(run), evaluate=self._evaluation(run),
                            items_per_step=config.batch_size,
                            extra_state={name: GeneratorState(g) for name, g in generators.items()})
        if config.resume:
            if objective.encoder_frozen:  # the encoder as this run used it, whatever --init holds now
                last = recover_dir(run.dir / "last")
                self.encoder.bert.load_hf_state_dict(load_state_dict_file(last / "model.safetensors"), source=str(last))
            loop.resume()
        return loop.fit(step_fn, after_step=objective.after_step)

    def _evaluation(self, run):
        """evaluate(step) of the loop (rank 0 only; the other ranks wait at a barrier): the evaluator,
        the objective's own metrics on the held-out sentences, and its evaluation metrics."""
        tokenizer = self.encoder.tokenizer
        heldout = self._batch(tokenizer(self.heldout[:HELDOUT_SENTENCES], truncation=True,
                                        max_length=self.config.max_length)["input_ids"]) if self.heldout else None

        def evaluate(step):
            result = self.evaluator(self.encoder) if self.evaluator is not None else {}
            if heldout is not None:
                result |= self.objective.heldout_metrics(*heldout)
            result |= self.objective.evaluation_metrics()
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


def trained_widths(objective, before):
    """The Matryoshka widths the encoder's checkpoints record (``SentenceEncoder.matryoshka_dims``):
    those its objective (a mixture: any part) trains at, None when it takes widths but is given
    none; ``before`` (the encoder's own) when no objective of the run takes them."""
    parts = list(objective.parts.values()) if hasattr(objective, "parts") else [objective]
    taken = [part.settings.matryoshka_dims for part in parts if hasattr(part.settings, "matryoshka_dims")]
    if not taken:
        return before
    dims = next((d for d in taken if d), None)
    return tuple(dims) if dims else None


def as_examples(data) -> Examples:
    """``data`` as ``Examples``: a list of sentences is a corpus (one column)."""
    return data if isinstance(data, Examples) else Examples([list(data)])
