"""Houlsby adapters (Houlsby et al. 2019, "Parameter-Efficient Transfer Learning for NLP") in minBERT,
written here: peft (0.21) has no bottleneck adapter, and the ``adapters`` library adapts transformers'
models only. ``--peft houlsby`` (models/peft.py: :func:`~bertcf.models.peft.make_adapters`).

Each transformer layer gets two adapters: one after the attention's output projection, one after the
feed-forward output projection, each after that projection's dropout and before the residual add and
the LayerNorm (the paper's Figure 2; google-research/adapter-bert's modeling.py places them so)::

    h <- h + W_up f(W_down h + b_down) + b_up        W_down [m, D], W_up [D, m]: the bottleneck m << D

- f is GELU, exact (erf), as minBERT's "gelu": the paper names a nonlinearity and adapter-bert's code
  uses BERT's GELU (its tanh approximation); a bottleneck with it is no linear map, so no merge into
  the weights exists;
- initialisation: W_up and b_up zero, so that at step 0 each adapter is the identity exactly and the
  adapted encoder computes what the base does (the paper's near-identity initialisation, made exact;
  adapter-bert draws W_up too, truncated normal of std 1e-3); W_down as adapter-bert, truncated normal
  of std 1e-3 (within two std), b_down zero. W_down's first gradient is zero (it flows through W_up),
  W_up's is not: from the second step both train, as LoRA's A and B do;
- as in the paper, the LayerNorm parameters train too: every LayerNorm of the encoder, the embeddings'
  and both of each layer (adapter-bert's ``layer_norm`` collection); the encoder's other weights stay
  frozen.

Several adapters at one place (``--peft-scope per-task``: ``shared`` and one per task) add their
branches: a task's rows get h + B_shared(h) + B_task(h), one adapter whose bottleneck is the shared
m units and the task's own m (f acts unit by unit); the LayerNorms are the encoder's, shared by every
task (Houlsby et al. train a copy per task, each task a model of its own).

minBERT is not edited: each sublayer's ``dropout`` module (``BertSelfOutput.dropout``,
``BertOutput.dropout``: what minBERT calls between the projection and the residual add) is replaced
by :class:`Adapted`, that dropout followed by the adapters; the base weights keep their names.

A checkpoint holds the base as it was loaded, its LayerNorms included (``model.safetensors``: the
encoder it started from), and beside it :data:`HOULSBY_WEIGHTS`, the adapters and the trained
LayerNorms under their names in the adapted model, and :data:`HOULSBY_CONFIG`, the bottleneck size
and the adapters' names; :meth:`HoulsbyAdapters.load` reads it back, unmerged.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert import CheckpointError

from ..errors import UsageError
from ..utils.files import atomic_path, write_json_atomic

HOULSBY_CONFIG, HOULSBY_WEIGHTS = "houlsby_config.json", "houlsby_model.safetensors"
#: The one adapter's name when every task shares it (peft's name for its one adapter).
DEFAULT = "default"
#: adapter-bert's init_scale: the std of W_down's truncated normal.
INIT_SCALE = 1e-3


class Bottleneck(nn.Module):
    """One adapter's branch: h -> W_up f(W_down h + b_down) + b_up (:class:`Adapted` adds h)."""

    def __init__(self, width: int, size: int, like: torch.Tensor):
        super().__init__()
        kinds = {"dtype": like.dtype, "device": like.device}
        self.down = nn.Linear(width, size, **kinds)
        self.up = nn.Linear(size, width, **kinds)
        with torch.no_grad():
            nn.init.trunc_normal_(self.down.weight, std=INIT_SCALE, a=-2 * INIT_SCALE, b=2 * INIT_SCALE)
            for p in (self.down.bias, self.up.weight, self.up.bias):
                p.zero_()

    def forward(self, h):
        return self.up(F.gelu(self.down(h)))


class Adapted(nn.Module):
    """A sublayer's output dropout, then its active adapters: y = dropout(x); y + sum of B(y)."""

    def __init__(self, dropout: nn.Module, width: int, size: int, names, like: torch.Tensor):
        super().__init__()
        self.dropout = dropout
        self.adapters = nn.ModuleDict({name: Bottleneck(width, size, like) for name in names})
        self.active = (next(iter(names)),)

    def forward(self, x):
        y = self.dropout(x)
        out = y
        for name in self.active:
            out = out + self.adapters[name](y)
        return out


def sublayer_outputs(bert: nn.Module) -> list:
    """The modules whose dropout the adapters follow: each layer's attention output and feed-forward
    output, in order, found by their class names (minBERT's, which are transformers' too), so that a
    wrapper of the model (the bench's) or transformers' BertModel is adapted as minBERT is."""
    return [m for m in bert.modules() if type(m).__name__ in ("BertSelfOutput", "BertOutput")]


def is_adapted(bert: nn.Module) -> bool:
    return any(isinstance(m, Adapted) for m in bert.modules())


class HoulsbyAdapters:
    """Houlsby adapters injected into ``bert`` (a minBERT) in place, its weights frozen but the
    LayerNorms'; the interface of :class:`~bertcf.models.peft.Adapters`. ``tasks``: one adapter per
    task beside ``shared`` (``--peft-scope per-task``), ``shared`` alone active outside :meth:`of_task`;
    none: the one adapter, :data:`DEFAULT`."""

    WHAT = "sublayer outputs"  # what modules() counts, for the run's budget line

    def __init__(self, bert: nn.Module, size: int, tasks=(), shared: str | None = None):
        if is_adapted(bert):
            raise UsageError("--peft houlsby: the encoder already carries Houlsby adapters (a --peft houlsby "
                             "checkpoint, which does not merge): train it on without --peft, or start from its base")
        self.size, self.tasks = size, tuple(tasks)
        self.names = (shared, *self.tasks) if self.tasks else (DEFAULT,)
        self._bert = bert
        self.base_layer_norms = {k: v.detach().clone() for k, v in self._layer_norm_state().items()}
        bert.requires_grad_(False)
        width = bert.config.hidden_size
        for out in sublayer_outputs(bert):
            out.dropout = Adapted(out.dropout, width, size, self.names, out.dense.weight)
        for m in bert.modules():
            if isinstance(m, nn.LayerNorm):
                m.requires_grad_(True)

    @classmethod
    def load(cls, path, bert: nn.Module, tasks=()) -> "HoulsbyAdapters":
        """The adapters saved in checkpoint ``path`` injected into ``bert`` (its base weights), their
        tensors and the trained LayerNorms read back. ``tasks``: the tasks the caller has; a per-task
        checkpoint must hold an adapter for each. Every weight is left trainable, as a plain checkpoint
        loads: a run that trains it on without --peft trains them all (--peft is refused on it)."""
        from safetensors.torch import load_file

        config = saved_config(path)
        missing = sorted(set(tasks) - set(config["tasks"])) if config["tasks"] else []
        if missing:
            raise CheckpointError(f"{Path(path) / HOULSBY_CONFIG}: no adapter for the tasks {', '.join(missing)}")
        with torch.random.fork_rng(devices=[]):  # the draws are overwritten: leave torch's generator as it was
            adapters = cls(bert, config["bottleneck"], config["tasks"], config.get("shared"))
        tensors = load_file(str(Path(path) / HOULSBY_WEIGHTS))
        own = adapters.state_dict()
        if tensors.keys() != own.keys() or any(tensors[k].shape != own[k].shape for k in own):
            raise CheckpointError(f"{Path(path) / HOULSBY_WEIGHTS} does not fit {HOULSBY_CONFIG} and the encoder")
        with torch.no_grad():
            for k, p in own.items():
                p.copy_(tensors[k])
        bert.requires_grad_(True)
        return adapters

    @property
    def bert(self) -> nn.Module:
        return self._bert

    def modules(self) -> int:
        """How many sublayer outputs carry adapters (two a layer)."""
        return len(sublayer_outputs(self._bert))

    def summary(self) -> str:
        per_task = f", one shared and one per task ({len(self.tasks)})" if self.tasks else ""
        return f"houlsby m {self.size} after each attention and feed-forward output, LayerNorms trained{per_task}"

    def activate(self, names: list) -> None:
        """``names`` the active adapters: their branches add up at each place."""
        for m in self._bert.modules():
            if isinstance(m, Adapted):
                m.active = tuple(names)

    @contextmanager
    def of_task(self, task: str):
        """The encoder of ``task``'s rows: the shared adapter and ``task``'s active, then ``shared`` alone again."""
        self.activate([self.names[0], task])
        try:
            yield
        finally:
            self.activate([self.names[0]])

    def parameters_of(self, name: str) -> list:
        """The parameters of adapter ``name`` (the shared one, a task's, or :data:`DEFAULT`); the
        LayerNorms are no adapter's."""
        return [p for m in self._bert.modules() if isinstance(m, Adapted) and name in m.adapters
                for p in m.adapters[name].parameters()]

    def _layer_norm_state(self) -> dict:
        return {f"{n}.{k}": p for n, m in self._bert.named_modules() if isinstance(m, nn.LayerNorm)
                for k, p in m.named_parameters()}

    def state_dict(self) -> dict:
        """What :data:`HOULSBY_WEIGHTS` holds: every adapter's parameters and the LayerNorms', by name in ``bert``."""
        adapters = {f"{n}.adapters.{k}": p for n, m in self._bert.named_modules() if isinstance(m, Adapted)
                    for k, p in m.adapters.named_parameters()}
        return adapters | self._layer_norm_state()

    def base_state_dict(self) -> dict:
        """``bert``'s weights without the adapters, the LayerNorms as they were loaded (minBERT's names)."""
        adapters = self.state_dict().keys() - self.base_layer_norms.keys()
        return {k: self.base_layer_norms.get(k, v) for k, v in self._bert.state_dict().items() if k not in adapters}

    def save(self, directory, link_weights_from=None) -> None:
        """The base as minBERT writes it, the adapters and LayerNorms beside it (:data:`HOULSBY_WEIGHTS`)
        and their settings (:data:`HOULSBY_CONFIG`). ``SentenceEncoder.save_pretrained`` removes the
        adapters saved there before."""
        from safetensors.torch import save_file

        directory = Path(directory)
        self._bert.save_pretrained(directory, link_weights_from, state_dict=self.base_state_dict())
        with atomic_path(directory / HOULSBY_WEIGHTS) as tmp:
            save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, str(tmp),
                      metadata={"format": "pt"})
        write_json_atomic(directory / HOULSBY_CONFIG, {
            "method": "houlsby", "bottleneck": self.size, "nonlinearity": "gelu", "layer_norms": "trained",
            "tasks": list(self.tasks), "shared": self.names[0] if self.tasks else None})


def has_houlsby(path) -> bool:
    return (Path(path) / HOULSBY_CONFIG).is_file()


def saved_config(path) -> dict:
    """The settings of the Houlsby adapters saved in checkpoint ``path`` (:data:`HOULSBY_CONFIG`)."""
    file = Path(path) / HOULSBY_CONFIG
    try:
        config = json.loads(file.read_text())
        int(config["bottleneck"]), list(config["tasks"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"{file} is not a readable Houlsby adapter config") from None
    return config
