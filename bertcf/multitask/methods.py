"""How a step's task losses become its update (``StepMethods``): the loss weighting
(``--task-weighting``: fixed, uncertainty, dwa; ``weighting``), SMART's regulariser
(``--smart-weight``; ``smart``) and the aggregation of the tasks' gradients on the encoder
(``--aggregator``; ``aggregation``). With the defaults (fixed weights, no SMART, ``sum``) the step
is the report's: one backward of the weighted sum, bit for bit."""
from __future__ import annotations

import torch

from ..errors import UsageError
from . import aggregation
from .smart import check_smart_weight
from .weighting import build_weighting


class StepMethods:
    """The methods of ``config`` (a MultitaskConfig) for ``model``'s tasks."""

    def __init__(self, config, model):
        self.config, self.model = config, model
        names = list(model.tasks)
        settings = {"temperature": config.dwa_temperature, "window": config.dwa_window} \
            if config.task_weighting == "dwa" else {}
        self.weighting = build_weighting(config.task_weighting, names, {t: model.tasks[t].weight for t in names},
                                         **settings)
        self.aggregator = aggregation.build_aggregator(config.aggregator, len(names))
        self._stash = None  # what the step's backward needs: the weighted losses and the features

    @staticmethod
    def check(config, tasks, world_size: int) -> None:
        """Refuse, in one line, what cannot run: an unknown aggregator or one without its solver, an
        aggregator with one task, under DDP or on a frozen encoder, SMART's weight not finite or under
        DDP, an adaptive weighting with one task a step."""
        aggregation.check_aggregator(config.aggregator, len(tasks), world_size)
        if config.aggregator != aggregation.SUM and config.freeze_encoder:
            raise UsageError(f"--aggregator {config.aggregator} combines the tasks' gradients on the encoder, which "
                             f"--freeze-encoder freezes: there is nothing to aggregate; use --aggregator "
                             f"{aggregation.SUM}")
        check_smart_weight(config.smart_weight)
        if config.smart_weight > 0 and world_size > 1:
            raise UsageError("--smart-weight cannot train on several processes: its extra forward passes run "
                             "outside DistributedDataParallel's gradient hooks; train on one process")
        if config.task_weighting != "fixed" and config.task_sampling != "all":
            raise UsageError(f"--task-weighting {config.task_weighting} weighs every task's loss each step: it "
                             f"needs --task-sampling all, not {config.task_sampling}")

    # ---- what the loop keeps -------------------------------------------------------------------
    def parameters(self) -> list:
        """Learned weights (uncertainty weighting's log-variances), trained with the model."""
        return [p for p in self.weighting.parameters() if p.requires_grad]

    def modules(self) -> dict:
        """Modules with state to save in last/ and resume (an adaptive weighting)."""
        return {"weighting": self.weighting} if self.config.task_weighting != "fixed" else {}

    def extra_state(self) -> dict:
        """A stateful aggregator's state, for resuming."""
        if aggregation.aggregator_state(self.aggregator) is None:
            return {}
        return {"aggregator": _AggregatorState(self.aggregator)}

    @property
    def custom_backward(self) -> bool:
        return self.aggregator is not None

    # ---- the step ------------------------------------------------------------------------------
    def combine(self, parts: dict, features, inputs: dict, out: dict) -> tuple[torch.Tensor, dict]:
        """The step's loss from its task losses ``parts``, and the scalars to log (the weights)."""
        total, weighted = self.weighting(parts)
        scalars = {f"weight_{t}": float(w) for t, w in self.weighting.weights().items() if t in parts}
        smart = None
        if self.config.smart_weight > 0:
            regulariser = self.smart_loss(inputs, out)
            smart = self.config.smart_weight * regulariser
            total = total + smart
            scalars["smart"] = regulariser.detach()
        self._stash = (weighted, features, scalars, smart)
        return total, scalars

    def backward(self, loss, scaler) -> None:
        """The aggregated backward (``--aggregator``): each task's weighted loss a row of the
        Jacobian on the encoder, the heads their own task's gradient."""
        weighted, features, scalars, smart = self._stash
        self._stash = None
        if smart is not None:  # no task's loss, so no row of the Jacobian: its gradient goes in as it is
            scaler.scale(smart).backward(retain_graph=True)
        names = list(weighted)
        losses = [scaler.scale(weighted[t]) for t in names]
        shared = [p for p in self.model.encoder.parameters() if p.requires_grad]
        weights = aggregation.aggregated_backward(losses, features, shared, self.aggregator,
                                                  loss_scale=scaler.get_scale() if scaler.is_enabled() else None)
        if weights is not None:
            scalars |= {f"aggregator_weight_{t}": float(w) for t, w in zip(names, weights.tolist())}

    # ---- SMART -----------------------------------------------------------------------------------
    def smart_loss(self, inputs: dict, out: dict) -> torch.Tensor:
        """SMART's regulariser on the step's batch: the word embeddings perturbed adversarially, the
        divergence of every task's outputs from the clean ones (``smart.SMARTLoss``)."""
        from .smart import SMARTLoss

        config = self.config
        embeddings = self.model.encoder.bert.embeddings.word_embeddings(inputs["input_ids"])

        def perturbed(embeds):
            return self.views(self.model(**inputs, inputs_embeds=embeds))
        smart = SMARTLoss(perturbed, {t: self.divergence(t, y) for t, y in out.items()}, num_steps=config.smart_steps,
                          step_size=config.smart_step_size, epsilon=config.smart_epsilon,
                          noise_var=config.smart_noise_var)
        return smart(embeddings, self.views(out))

    def views(self, out: dict) -> dict:
        """What each task predicts from its head's output, as SMART compares it (``TaskHead.view``:
        logits, or a value such as a cosine pair's y = max(cos, h))."""
        return {name: self.model.heads[name].view(y) for name, y in out.items()}

    def divergence(self, name: str, y):
        """SMART's l_s for a task's view (``TaskHead.divergence``; Jiang et al. 2020): symmetric KL
        for logits, squared error for values."""
        return self.model.heads[name].divergence(y)


class _AggregatorState:
    """A stateful torchjd aggregator as the loop's extra state (state_dict / load_state_dict)."""

    def __init__(self, aggregator):
        self.aggregator = aggregator

    def state_dict(self):
        return {"pickled": aggregation.aggregator_state(self.aggregator)}

    def load_state_dict(self, state):
        aggregation.load_aggregator_state(self.aggregator, state["pickled"])
