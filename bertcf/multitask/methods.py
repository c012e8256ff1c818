"""How a step's task losses become its update (``StepMethods``): the loss weighting
(``--task-weighting``: fixed, uncertainty, dwa; ``weighting``), SMART's regulariser
(``--smart-weight``; ``smart``) and the aggregation of the tasks' gradients on the encoder
(``--aggregator``; ``aggregation``), behind two calls: ``losses`` (the step's ``StepLosses``)
and ``backward`` (the update, whatever the methods; it returns the weights to log). With the
defaults (fixed weights, no SMART, ``sum``) the step is the report's: one backward of the weighted
sum, bit for bit."""
from __future__ import annotations

import torch

from ..errors import UsageError
from . import aggregation
from .smart import check_smart_weight
from .step import StepLosses
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

    @staticmethod
    def check(config, tasks, world_size: int) -> None:
        """Refuse, in one line, what cannot run on these tasks and processes: an unknown aggregator or
        one without its solver, an aggregator with one task or under DDP, SMART's weight not finite or
        under DDP. (The methods' settings among themselves: ``config.check_settings``.)"""
        aggregation.check_aggregator(config.aggregator, len(tasks), world_size, config.aggregator_gramian)
        check_smart_weight(config.smart_weight)
        if config.smart_weight > 0 and world_size > 1:
            raise UsageError("--smart-weight cannot train on several processes: its extra forward passes run "
                             "outside DistributedDataParallel's gradient hooks; train on one process")

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

    # ---- the step ------------------------------------------------------------------------------
    def losses(self, task_losses: dict, features, inputs: dict, out: dict) -> StepLosses:
        """The step's losses from its ``task_losses`` (task -> L_t), weighted, with SMART's
        term on ``inputs`` and the heads' outputs ``out``; ``features``: what the heads read."""
        weights = self.weighting.weights()  # before DWA's forward, which may start a new period's
        total, weighted = self.weighting(task_losses)
        losses = StepLosses(total, weighted, features, {t: float(weights[t]) for t in task_losses})
        if self.config.smart_weight > 0:
            regulariser = self.smart_loss(inputs, out)
            losses.smart = self.config.smart_weight * regulariser
            losses.total = total + losses.smart
            losses.regulariser = regulariser.detach()
        return losses

    def backward(self, losses: StepLosses, scaler) -> dict:
        """The step's update, for every method: fills the gradients from ``losses`` (scaled by
        the GradScaler ``scaler``) and returns the weights to log (``weight_TASK``, the loss
        weights; ``aggregator_weight_TASK``, where the aggregator weighs the tasks' gradients
        linearly; ``smart``, the regulariser). With ``sum`` one backward of ``losses.total``:
        the report's step, bit for bit, whatever the weighting and SMART. With an aggregator,
        each task's weighted loss a row of the Jacobian on the encoder, the heads their own
        task's gradient, SMART's term backpropagated as it is (it is no task's)."""
        logged = {f"weight_{t}": w for t, w in losses.weights.items()}
        if losses.regulariser is not None:
            logged["smart"] = losses.regulariser
        if self.aggregator is None:
            scaler.scale(losses.total).backward()
            return logged
        if losses.smart is not None:
            scaler.scale(losses.smart).backward(retain_graph=True)
        names = list(losses.weighted)
        shared = [p for p in self.model.encoder.parameters() if p.requires_grad]
        weights = aggregation.aggregated_backward([scaler.scale(losses.weighted[t]) for t in names], losses.features,
                                                  shared, self.aggregator, gramian=self.config.aggregator_gramian,
                                                  loss_scale=scaler.get_scale() if scaler.is_enabled() else None)
        if weights is not None:
            logged |= {f"aggregator_weight_{t}": float(w) for t, w in zip(names, weights.tolist())}
        return logged

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
