"""Several objectives on one encoder, each with its own data (``Mixture``): one dataset's batch a
step, as sentence-transformers' multi-dataset training draws them."""
from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import UsageError
from .base import BaseObjective, Objective


class Mixture(BaseObjective):
    """``parts``: name -> objective, all on the same encoder (e.g. unsupervised SimCSE on a corpus
    and supervised SimCSE on NLI triples). Each step trains one part, on a batch of its own
    dataset (``Trainer``: the datasets, keyed alike, taken in turn or in proportion to their size);
    the encoder takes every part's updates, each part keeps its own heads.

    It has an objective's shape (``BaseObjective``): ``mixture(ids, mask, special, rank, world, dataset=name, ...)`` is
    the named part's loss, whose scalars come back under ``name/``, with the latest loss of every
    part (``loss_<name>``: what TensorBoard plots per dataset); ``evaluation_metrics()`` gives each
    part's mean training loss since the last evaluation (``train_loss_<name>`` in metrics.jsonl)."""

    def __init__(self, parts: dict[str, Objective]):
        super().__init__()
        if len(parts) < 2:
            raise UsageError("a mixture needs two or more (objective, data) parts")
        encoder = next(iter(parts.values())).encoder
        if any(part.encoder is not encoder for part in parts.values()):
            raise UsageError("the parts of a mixture must train one encoder: build each on the same SentenceEncoder")
        self.parts = nn.ModuleDict(parts)
        self.encoder = encoder
        self._latest: dict[str, torch.Tensor] = {}
        self._since: dict[str, list] = {}  # name -> [sum of losses, steps] since the last evaluation
        self._last = None

    @property
    def needs_text(self) -> bool:
        return any(part.needs_text for part in self.parts.values())

    def generators(self) -> dict[str, torch.Generator]:
        return {name: part.generator for name, part in self.parts.items()}

    def parameter_groups(self) -> list[dict]:
        """Every part's groups, each parameter once (the encoder's belong to the first part)."""
        seen, groups = set(), []
        for part in self.parts.values():
            for group in part.parameter_groups():
                params = [p for p in group["params"] if id(p) not in seen]
                seen |= {id(p) for p in params}
                if params:
                    groups.append(group | {"params": params})
        return groups

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        """Every part's modules, under ``name.module``, each module once."""
        out, seen = {}, set()
        for name, part in self.parts.items():
            for key, module in part.checkpoint_modules().items():
                if id(module) not in seen:
                    seen.add(id(module))
                    out[f"{name}.{key}"] = module
        return out

    def forward(self, ids, mask, special, rank: int = 0, world: int = 1, dataset: str | None = None, **extra):
        if dataset not in self.parts:
            raise UsageError(f"no part {dataset!r} in the mixture (its parts: {', '.join(self.parts)})")
        part = self.parts[dataset]
        loss, scalars = part(ids, mask, special, rank, world, **extra)
        detached = loss.detach()
        self._latest[dataset] = detached
        total = self._since.setdefault(dataset, [0.0, 0])
        total[0], total[1] = total[0] + detached, total[1] + 1
        self._last = dataset
        return loss, {f"{dataset}/{k}": v for k, v in scalars.items()} | {
            f"loss_{name}": value for name, value in self._latest.items()}

    def after_step(self) -> None:
        if self._last is not None:  # the part that trained this step (BSL's EMA)
            self.parts[self._last].after_step()

    def heldout_metrics(self, ids, mask, special) -> dict:
        return {k: v for part in self.parts.values() for k, v in part.heldout_metrics(ids, mask, special).items()}

    def evaluation_metrics(self) -> dict:
        metrics = {f"train_loss_{name}": float(total) / steps for name, (total, steps) in self._since.items() if steps}
        self._since = {}
        return metrics

    def description(self) -> dict:
        return {"objective": "Mixture", "parts": {name: part.description() for name, part in self.parts.items()}}
