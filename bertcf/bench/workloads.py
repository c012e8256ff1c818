"""The workloads (see :mod:`bertcf.bench`): their inputs, shared by both implementations, and per
implementation a ``step()`` closure plus the per-step counts (sentences, real tokens, FLOPs)."""
from __future__ import annotations

from functools import partial

import torch

from .batches import LENGTHS, make_batch, sample_lengths, special_ids
from .timing import adapted_encoder_flops, encoder_flops

#: Stage 3's step with a multitask setting changed (bertcf.multitask.config's names): how tasks share
#: the steps, the gradient-conflict logging at every step, and the multitask methods.
MULTITASK_VARIANTS = {
    "multitask-round-robin": {"task_sampling": "round-robin"},
    "multitask-proportional": {"task_sampling": "proportional"},
    "multitask-temperature": {"task_sampling": "temperature"},
    "multitask-annealed": {"task_sampling": "annealed"},
    "multitask-conflict": {"conflict_every": 1},
    "multitask-pcgrad": {"aggregator": "pcgrad"},
    "multitask-upgrad": {"aggregator": "upgrad"},
    "multitask-upgrad-gramian": {"aggregator": "upgrad", "aggregator_gramian": True},
    "multitask-mgda": {"aggregator": "mgda"},
    "multitask-uncertainty": {"task_weighting": "uncertainty"},
    "multitask-dwa": {"task_weighting": "dwa"},
    "multitask-smart": {"smart_weight": 1.0},
}
#: Stage 3's step with adapters (``run_multitask.py --peft X --peft-scope Y``, their default settings)
#: instead of full fine-tuning (``multitask``); all but houlsby need the peft extra.
PEFT_VARIANTS = {f"multitask-{method}{suffix}": {"peft": method, "peft_scope": scope}
                 for scope, suffix in (("shared", ""), ("per-task", "-per-task"))
                 for method in ("lora", "dora", "ia3", "houlsby")}
MULTITASK_VARIANTS |= PEFT_VARIANTS
DEFAULT_WORKLOADS = ("mirror", "joint", "multitask", "encode")
WORKLOADS = (*DEFAULT_WORKLOADS, *MULTITASK_VARIANTS)


class Workload:
    """Inputs shared by both models, and per model a ``step()`` closure plus per-step counts."""

    training = True

    def __init__(self, name, config, device, precision, n_batches, seed):
        self.name, self.config, self.device, self.precision = name, config, torch.device(device), precision
        self.g = torch.Generator().manual_seed(seed)
        self.cls, self.sep, self.mask_id = special_ids(config.vocab_size)
        self.batches = self.make_inputs(n_batches)

    @classmethod
    def unavailable(cls, name) -> str | None:
        """Why workload ``name`` cannot run here (a library missing), or None."""
        return None

    @staticmethod
    def measured(step, module, optimizer=None):
        """``step`` with what :func:`.timing.step_memory` measures: the module it runs, the optimiser."""
        step.module, step.optimizer = module, optimizer
        return step

    def batch(self, n, kind):
        median, max_len = LENGTHS[kind]
        max_len = min(max_len, self.config.max_position_embeddings)
        return make_batch(sample_lengths(n, median, max_len, self.g), self.config.vocab_size, self.g, self.device,
                          (self.cls, self.sep))

    def autocast(self):
        from ..utils.precision import autocast
        return autocast(self.device, self.precision)

    def training_step(self, params, lr, loss_fn, module):
        """A step closure: ``loss_fn(inputs)`` through ``training.update`` (autocast, scaled
        backward) with AdamW (fused, weight decay 0.01) over ``params`` (or parameter groups) of ``module``."""
        from ..training.optim import make_optimizer, update

        opt = make_optimizer(params, lr, 0.01, self.device)
        scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")

        def step(inputs):
            return update(opt, scaler, lambda: (loss_fn(inputs), {}), self.device, self.precision)[0]
        return self.measured(step, module, opt)

    # per-step figures, averaged over the input pool
    def sentences(self, inputs) -> int:
        return sum(len(b.lengths) for b in inputs)

    def real_tokens(self, inputs) -> int:
        return sum(b.tokens for b in inputs)

    def padded_tokens(self, inputs) -> int:
        """The tokens of the padded batches: what transformers computes, where unpadded minBERT
        computes ``real_tokens`` (their ratio bounds what unpadding can gain)."""
        return sum(b.mask.numel() for b in inputs)

    def flops(self, inputs) -> float:
        return sum(encoder_flops(self.config, b.lengths, self.training) for b in inputs)


class Mirror(Workload):
    """Pretraining's own objective (``bertcf.objectives``) on batches of 16 corpus sentences on the
    host, as pretraining hands them over: it draws the views, copies them to the device, encodes."""

    stage = "mirror"

    def make_inputs(self, n):
        inputs = []
        for _ in range(n):
            b = self.batch(16, "mirror")
            b.ids, b.mask = b.ids.cpu(), b.mask.cpu()
            b.special = (b.ids == self.cls) | (b.ids == self.sep) | (b.mask == 0)
            inputs.append([b])
        return inputs

    def build(self, bert):
        from types import SimpleNamespace

        from ..models.encoder import SentenceEncoder
        from ..config.pretrain import STAGE_LR
        from ..objectives import objective_class

        bert.requires_grad_(True)  # a joint workload before may have frozen it
        torch.manual_seed(0)  # the same initial flow for both implementations
        tokenizer = SimpleNamespace(mask_token_id=self.mask_id, pad_token_id=0)
        objective = objective_class(self.stage, "mirror")(SentenceEncoder(bert, tokenizer),
                                                          generator=torch.Generator().manual_seed(0))
        objective = objective.to(self.device).train()

        def loss(inputs):
            (b,) = inputs
            return objective(b.ids, b.mask, b.special)[0]
        return self.training_step(objective.parameter_groups(), STAGE_LR[self.stage], loss, objective)

    # The encoder sees two views of each sentence.
    def sentences(self, inputs) -> int:
        return 2 * super().sentences(inputs)

    def real_tokens(self, inputs) -> int:
        return 2 * super().real_tokens(inputs)

    def padded_tokens(self, inputs) -> int:
        return 2 * super().padded_tokens(inputs)

    def flops(self, inputs):
        return sum(encoder_flops(self.config, b.lengths * 2, self.training) for b in inputs)


class Joint(Mirror):
    """BERT-CF's objective: the frozen encoder (forward only, dropout on as in the stage) and the flow."""

    stage = "joint"
    training = False  # the encoder only runs forward; the flow's FLOPs are added below

    def flops(self, inputs):
        d = self.config.hidden_size
        flow_qqpms = 3 * (d * d + (d // 2) * d + d * (d - d // 2))  # 1x1 + coupling MLP, roughly
        return super().flops(inputs) + sum(6 * flow_qqpms * 2 * len(b.lengths) for b in inputs)


class Multitask(Workload):
    """bertcf.multitask's training step itself: MultitaskModel (one encoder pass over the step's
    sentences, the heads; 288 with a batch of every task), the tasks' losses combined by
    ``StepMethods``, around either implementation. A variant of :data:`MULTITASK_VARIANTS` changes
    one setting: the tasks a step draws (``TaskSampler`` over the CS224N training sets' sizes), the
    gradient cosines at every step (``conflict_every``), a multitask method, or peft's adapters
    (:data:`PEFT_VARIANTS`: the encoder frozen, added as a run adds them, ``MultitaskModel.add_adapters``,
    in a copy of the encoder, which the other workloads time as it is; per task, one encoder pass per
    task). The optimiser is the run's: AdamW over the trainable parameters at the run's lr and decay."""

    sizes = {"sst": 32, "qqp": 96, "sts": 32}
    TRAIN_SIZES = {"sst": 8544, "qqp": 141506, "sts": 6040}

    def __init__(self, name, *args, **kwargs):
        from ..multitask.config import MultitaskConfig

        self.settings = MULTITASK_VARIANTS.get(name, {})
        super().__init__(name, *args, **kwargs)
        self.run_config = MultitaskConfig(precision=self.precision, **{"conflict_every": 0} | self.settings)

    @classmethod
    def unavailable(cls, name) -> str | None:
        import importlib.util

        if PEFT_VARIANTS.get(name, {}).get("peft", "houlsby") != "houlsby" and importlib.util.find_spec("peft") is None:
            return "needs the peft library: pip install -e \".[peft]\""
        return None

    def make_inputs(self, n):
        from ..training.sampler import TaskSampler

        sampler = TaskSampler(self.settings.get("task_sampling", "all"), self.TRAIN_SIZES, n, seed=0)
        out = []
        for step in range(n):
            chosen = {t: self.sizes[t] for t in sampler.tasks_at(step)}
            lengths = []
            for task, size in chosen.items():
                median, max_len = LENGTHS[task]
                rows = size * (1 if task == "sst" else 2)
                lengths += sample_lengths(rows, median, min(max_len, self.config.max_position_embeddings), self.g)
            b = make_batch(lengths, self.config.vocab_size, self.g, self.device, (self.cls, self.sep))
            b.sizes = chosen
            out.append([b])
        return out

    def build(self, bert):
        import copy

        from ..models.encoder import SentenceEncoder
        from ..multitask import monitor
        from ..multitask.methods import StepMethods
        from ..multitask.model import MultitaskModel
        from ..multitask.step import step_losses
        from ..multitask.tasks import builtin_tasks
        from ..training.optim import make_optimizer, update

        config = self.run_config
        if config.peft:  # peft wraps the Linear layers in place: a copy, the encoder the other workloads time kept
            bert = copy.deepcopy(bert)
        torch.manual_seed(0)  # the same initial heads for both implementations
        tasks = builtin_tasks()
        model = MultitaskModel(SentenceEncoder(bert, tokenizer=None), list(tasks.values()), proj_dim=768)
        model.requires_grad_(True)  # a workload before may have frozen the encoder
        if config.peft:
            model.add_adapters(config)  # as a run does: the encoder frozen, the adapters trained
        model.to(self.device).train()
        methods = StepMethods(config, model)
        g = torch.Generator(device=self.device).manual_seed(0)
        labels = {"sst": torch.randint(0, 5, (32,), generator=g, device=self.device),
                  "qqp": torch.randint(0, 2, (96,), generator=g, device=self.device).float(),
                  "sts": torch.rand(32, generator=g, device=self.device) * 5}
        opt = make_optimizer([*model.parameters(), *methods.parameters()], config.lr, config.weight_decay, self.device)
        scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        # the variant computes the cosines at every step, as the trainer does at its logged ones
        conflicts = partial(monitor.task_conflicts, model) if config.conflict_every else None

        def step(inputs):  # the trainer's step (bertcf.multitask.step) on this workload's batch
            (b,) = inputs
            batch = {"input_ids": b.ids, "attention_mask": b.mask, "sizes": b.sizes, "num_tokens": b.tokens}
            return update(opt, scaler, lambda: step_losses(model, methods, batch, labels, conflicts=conflicts),
                          self.device, self.precision, backward=methods.backward)[0]
        return self.measured(step, model, opt)

    def flops(self, inputs):
        d = self.config.hidden_size
        heads = sum(6 * d * (5 * b.sizes.get("sst", 0) + 768 * 2 * (b.sizes.get("qqp", 0) + b.sizes.get("sts", 0)))
                    for b in inputs)
        if not self.run_config.peft:
            return super().flops(inputs) + heads  # the encoder's and the heads'; a method's extra passes are timed
        from ..models.peft import PeftSettings

        settings = PeftSettings(**PeftSettings.pick(self.run_config))
        per_task = self.run_config.peft_scope == "per-task"  # shared + the task's adapter, a pass per task
        return heads + sum(adapted_encoder_flops(self.config, b.lengths, settings, adapters=2 if per_task else 1,
                                                 passes=len(b.sizes) if per_task else 1) for b in inputs)


class Encode(Workload):
    training = False

    def __init__(self, *args, sentences=256, batch_size=64, **kwargs):
        self.n_sentences, self.batch_size = sentences, batch_size
        super().__init__(*args, **kwargs)

    def make_inputs(self, n):
        """One input = one encode() call: the sentences sorted by length, in batches of 64."""
        out = []
        for _ in range(n):
            median, max_len = LENGTHS["encode"]
            lengths = sorted(sample_lengths(self.n_sentences, median, min(max_len, self.config.max_position_embeddings),
                                            self.g), reverse=True)
            out.append([make_batch(lengths[i:i + self.batch_size], self.config.vocab_size, self.g, self.device,
                                   (self.cls, self.sep)) for i in range(0, len(lengths), self.batch_size)])
        return out

    def build(self, bert):
        from ..models.encoder import pool

        bert.eval()

        @torch.inference_mode()
        def step(inputs):
            out = None
            for b in inputs:
                with self.autocast():
                    out = pool(b.hidden(bert), b.mask)
            return out
        return self.measured(step, bert)


WORKLOAD_CLASSES = {"mirror": Mirror, "joint": Joint, "multitask": Multitask, "encode": Encode,
                    **dict.fromkeys(MULTITASK_VARIANTS, Multitask)}
