"""Parameter-efficient fine-tuning of minBERT through Hugging Face's peft: the encoder's weights
frozen, small adapters in its Linear layers trained instead.

- ``lora``: LoRA (Hu et al. 2021), W x + (alpha / r) B A x, A [r, in] and B [out, r], B zero at the
  start (the update starts at zero);
- ``dora``: DoRA (Liu et al. 2024), the LoRA'd weight split into a learned magnitude per output and
  a direction, m (W + (alpha / r) B A) / ||W + (alpha / r) B A||;
- ``ia3``: IA3 (Liu et al. 2022, T-Few), learned vectors that rescale the keys, the values and the
  feed-forward activations (the input of a feed-forward layer), ones at the start;
- ``houlsby``: Houlsby et al. 2019's bottleneck adapters after each layer's attention and feed-forward
  outputs, h + W_up f(W_down h + b_down) + b_up, the LayerNorms trained too; peft has none, so they are
  written here (models/bottleneck.py, :class:`~bertcf.models.bottleneck.HoulsbyAdapters`, which
  :func:`make_adapters` gives for them). They do not merge: their checkpoints load unmerged.

peft wraps any ``nn.Linear`` by name, so no transformers model is needed: :class:`Adapters` injects
the adapters into the minBERT in place (it stays a ``minbert.BertModel``, its Linear layers wrapped;
minBERT calls its query, key and value one by one once they are wrapped, so that their adapters
apply). A target names Linear layers as peft's ``target_modules`` do: a module whose name is the
target or ends with ``.target`` (``query``; ``output.dense``, which is both the attention's output and
the second feed-forward layer). The default is every Linear layer of each transformer layer (the
pooler aside) for LoRA and DoRA, and peft's BERT default for IA3 (``key``, ``value``, ``output.dense``,
the last a feed-forward layer).

A checkpoint of an adapted encoder holds the base weights as minBERT writes them
(``model.safetensors``, unchanged by training) and beside them the adapter as peft saves it
(``adapter_config.json``, ``adapter_model.safetensors``: ``peft.PeftModel.from_pretrained`` loads
it); :func:`load_merged` reads one back with the adapter merged into the weights (peft's
``merge_and_unload``), a plain minBERT that the ONNX export, ``encode`` and sentence-transformers
read as any other. peft is optional (``pip install -e ".[peft]"``): it is imported when used.

Stage 3's ``--peft-scope per-task`` gives each task an adapter of its own beside a shared one: peft's
named adapters in one injection (``shared`` and one per task, each drawn as peft draws a new one),
a task's rows encoded with ``shared`` and its own active (LoRA and DoRA add the active adapters'
updates, IA3 multiplies their vectors). peft saves each adapter in a folder of its name
(``shared/``, ``sst/``, ...: config and weights); such a checkpoint has no single merged encoder, so
:func:`load_merged` refuses it and :meth:`Adapters.load` reads it back unmerged.
"""
from __future__ import annotations

import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn

from minbert import CheckpointError

from .. import cli
from ..errors import UsageError
from ..settings import Settings, option
from .bottleneck import HOULSBY_CONFIG, HOULSBY_WEIGHTS, HoulsbyAdapters, has_houlsby, is_adapted, saved_config

METHODS = ("lora", "dora", "ia3", "houlsby")
#: Every Linear layer of a transformer layer: attention's query, key, value and output, both feed-forward layers.
LAYER_LINEARS = ("query", "key", "value", "output.dense", "intermediate.dense")
DEFAULT_TARGETS = {"lora": LAYER_LINEARS, "dora": LAYER_LINEARS, "ia3": ("key", "value", "output.dense")}
IA3_FEEDFORWARD = ("output.dense",)
#: The settings that do not apply to each method (houlsby's adapters sit at fixed places: no targets).
NOT_FOR = {None: (), "lora": ("peft_feedforward", "peft_bottleneck"), "dora": ("peft_feedforward", "peft_bottleneck"),
           "ia3": ("peft_rank", "peft_alpha", "peft_dropout", "peft_bottleneck"),
           "houlsby": ("peft_rank", "peft_alpha", "peft_dropout", "peft_targets", "peft_feedforward")}
#: peft's file names (peft.utils.CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME).
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
#: The adapter every task passes through under --peft-scope per-task (a task of that name is refused).
SHARED = "shared"
NAMES = cli.comma_list(str, lambda v: all(v), "comma-separated module names, e.g. query,value")


@dataclass(frozen=True)
class PeftSettings(Settings):
    """The adapters of ``--peft``; each setting that does not apply to the method is refused."""

    GROUP = "parameter-efficient fine-tuning (peft)"
    peft: str | None = option(None, "train adapters in the frozen encoder instead of its weights: lora (Hu et al. "
                                    "2021), dora (Liu et al. 2024), ia3 (Liu et al. 2022), houlsby (Houlsby et al. "
                                    "2019: bottleneck adapters, the LayerNorms trained too)", choices=METHODS)
    peft_rank: int = option(8, "lora, dora: the rank r of the update B A", type=cli.AT_LEAST_1)
    peft_alpha: float = option(16.0, "lora, dora: alpha; the update is scaled by alpha / r", type=cli.POSITIVE)
    peft_dropout: float = option(0.0, "lora, dora: dropout on the adapter's input", type=cli.PROBABILITY)
    peft_targets: tuple | None = option(None, "the Linear layers adapted, by name or name suffix as peft's "
                                              "target_modules (default: lora, dora: " + ",".join(LAYER_LINEARS)
                                              + "; ia3: key,value,output.dense)", type=NAMES, metavar="NAMES")
    peft_feedforward: tuple | None = option(None, "ia3: the targets that are feed-forward layers, whose input is "
                                                  "rescaled rather than their output (default output.dense)",
                                            type=NAMES, metavar="NAMES")
    peft_bottleneck: int = option(64, "houlsby: the bottleneck size m of each adapter, W_down [m, D]",
                                  type=cli.AT_LEAST_1)
    merge: bool = option(False, "--peft lora|dora|ia3: at the end, also write merged/: the best checkpoint with its "
                                "adapter merged into the weights (peft's merge_and_unload), a plain checkpoint",
                         switch=True)

    def __post_init__(self):
        super().__post_init__()
        for name in ("peft_targets", "peft_feedforward"):  # a list from config.json or Python
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        fields = type(self).__dataclass_fields__
        given = [n for n in ("peft_rank", "peft_alpha", "peft_dropout", "peft_targets", "peft_feedforward",
                             "peft_bottleneck", "merge") if getattr(self, n) != fields[n].default]
        if self.peft is None and given:
            raise UsageError(f"--{given[0].replace('_', '-')} does not apply without --peft")
        if self.peft == "houlsby" and self.merge:
            raise UsageError("--merge does not apply to --peft houlsby: its bottleneck adapters have a nonlinearity "
                             "(GELU), which no weight of the encoder can absorb; their checkpoints load unmerged")
        wrong = next((n for n in given if n in NOT_FOR[self.peft]), None)
        if wrong:
            raise UsageError(f"--{wrong.replace('_', '-')} does not apply to --peft {self.peft}")
        outside = set(self.feedforward_modules) - set(self.target_modules)
        if self.peft == "ia3" and outside:
            raise UsageError(f"--peft-feedforward {','.join(sorted(outside))}: not among the targets "
                             f"({','.join(self.target_modules)})")

    @property
    def target_modules(self) -> tuple:
        return self.peft_targets or DEFAULT_TARGETS.get(self.peft, ())

    @property
    def feedforward_modules(self) -> tuple:
        return self.peft_feedforward or (IA3_FEEDFORWARD if self.peft == "ia3" else ())

    def peft_config(self):
        """peft's config of these settings."""
        import peft

        if self.peft == "ia3":
            return peft.IA3Config(target_modules=list(self.target_modules),
                                  feedforward_modules=list(self.feedforward_modules))
        return peft.LoraConfig(r=self.peft_rank, lora_alpha=self.peft_alpha, lora_dropout=self.peft_dropout,
                               target_modules=list(self.target_modules), use_dora=self.peft == "dora")

    def peft_summary(self) -> str:
        if self.peft == "ia3":
            return f"ia3 on {','.join(self.target_modules)}"
        return f"{self.peft} r {self.peft_rank}, alpha {self.peft_alpha:g} on {','.join(self.target_modules)}"


def settings_of(config) -> PeftSettings:
    """The settings a saved adapter was made with, from peft's config of it (a ``LoraConfig`` or an
    ``IA3Config``; peft keeps the targets as a set: the default's, None, or the defaults' order first,
    then the rest sorted)."""
    def ordered(names, default):
        if set(names) == set(default):
            return None
        return tuple(n for n in default if n in names) + tuple(sorted(set(names) - set(default)))
    if type(config).__name__ == "IA3Config":
        return PeftSettings(peft="ia3", peft_targets=ordered(config.target_modules, DEFAULT_TARGETS["ia3"]),
                            peft_feedforward=ordered(config.feedforward_modules, IA3_FEEDFORWARD))
    return PeftSettings(peft="dora" if config.use_dora else "lora", peft_rank=config.r,
                        peft_alpha=float(config.lora_alpha), peft_dropout=config.lora_dropout,
                        peft_targets=ordered(config.target_modules, LAYER_LINEARS))


def matching(model: nn.Module, target: str) -> list[str]:
    """The names of ``model``'s modules that ``target`` names, as peft matches a target_modules entry."""
    return [name for name, _ in model.named_modules() if name == target or name.endswith("." + target)]


def check_targets(model: nn.Module, targets) -> None:
    """UsageError, one line, for a target that names no module of ``model``, or one that is not a Linear layer."""
    modules = dict(model.named_modules())
    linears = sorted({re.sub(r"^encoder\.layer\.\d+\.", "", name) for name, m in modules.items()
                      if type(m) is nn.Linear})
    for target in targets:
        names = matching(model, target)
        if not names:
            raise UsageError(f"--peft-targets {target}: matches no module of the encoder (its Linear layers: "
                             f"{', '.join(linears)})")
        other = next((n for n in names if type(modules[n]) is not nn.Linear), None)
        if other:
            raise UsageError(f"--peft-targets {target}: {other} is a {type(modules[other]).__name__}, not a Linear "
                             f"layer")


def check_task_names(tasks) -> None:
    if SHARED in tasks:
        raise UsageError(f"--peft-scope per-task: a task named {SHARED!r} would share the shared adapter's name; "
                         f"rename the task")


def make_adapters(bert: nn.Module, settings: PeftSettings, tasks=()):
    """The adapters of ``settings`` injected into ``bert``: Houlsby's (models/bottleneck.py) for
    ``--peft houlsby``, else peft's (:class:`Adapters`); ``tasks``: one adapter per task beside a shared one."""
    if settings.peft == "houlsby":
        check_task_names(tasks)  # (Adapters checks its own)
        return HoulsbyAdapters(bert, settings.peft_bottleneck, tasks, SHARED)
    return Adapters(bert, settings, tasks)


def _peft():
    try:
        import peft
    except ImportError:
        raise UsageError("--peft needs the peft library: pip install -e \".[peft]\"") from None
    return peft


class Adapters:
    """peft's adapters of ``settings`` injected into ``bert`` (a minBERT) in place; its base weights
    frozen. ``model``: the ``peft.PeftModel`` around it, which saves the adapter and merges it.
    ``tasks``: one adapter per task beside the :data:`SHARED` one (--peft-scope per-task), each
    trained, ``shared`` alone active outside :meth:`of_task`; none: the one adapter, peft's default.
    :func:`make_adapters` gives these or, for ``houlsby``, :class:`~bertcf.models.bottleneck.HoulsbyAdapters`."""

    WHAT = "Linear layers"  # what modules() counts, for the run's budget line

    def __init__(self, bert: nn.Module, settings: PeftSettings, tasks=()):
        if settings.peft == "houlsby":
            raise ValueError("houlsby is no peft method: make_adapters gives its HoulsbyAdapters")
        if is_adapted(bert):
            raise UsageError(f"--peft {settings.peft}: the encoder carries Houlsby adapters (a --peft houlsby "
                             f"checkpoint, which does not merge): train it on without --peft, or start from its base")
        check_targets(bert, settings.target_modules)
        self.settings, self.tasks = settings, tuple(tasks)
        check_task_names(self.tasks)
        if not self.tasks:
            self.model = _peft().get_peft_model(bert, settings.peft_config())
            return
        self.model = _peft().get_peft_model(bert, settings.peft_config(), adapter_name=SHARED)
        for task in self.tasks:
            self.model.add_adapter(task, settings.peft_config())
        # peft trains only the active adapters: all of them active once makes each trainable, as peft sets it
        self.model.base_model.set_adapter([SHARED, *self.tasks])
        self.activate([SHARED])

    @classmethod
    def load(cls, path, bert: nn.Module, tasks) -> "Adapters":
        """The adapters of a per-task checkpoint ``path`` (``shared/`` and one folder per task of
        ``tasks``, as peft saved them) in ``bert`` (its base weights), unmerged, not trained."""
        peft = _peft()
        adapters = cls.__new__(cls)
        adapters.tasks = tuple(tasks)
        adapters.model = peft.PeftModel.from_pretrained(bert, str(Path(path) / SHARED), adapter_name=SHARED)
        adapters.settings = settings_of(adapters.model.peft_config[SHARED])
        for task in adapters.tasks:
            adapters.model.load_adapter(str(Path(path) / task), adapter_name=task)
        adapters.activate([SHARED])
        return adapters

    @property
    def bert(self) -> nn.Module:
        return self.model.get_base_model()

    def modules(self) -> int:
        """How many Linear layers carry an adapter."""
        return len(self.model.base_model.targeted_module_names)

    def summary(self) -> str:
        per_task = f", one shared and one per task ({len(self.tasks)})" if self.tasks else ""
        return f"{self.settings.peft_summary()}{per_task}"

    def activate(self, names: list) -> None:
        """``names`` the active adapters: peft's ``set_adapter``, without its freezing of the others (a
        step runs several tasks' adapters before its one backward, which trains them all)."""
        trained = [(p, p.requires_grad) for p in self.model.parameters()]
        self.model.base_model.set_adapter(names)
        for p, flag in trained:
            p.requires_grad_(flag)

    @contextmanager
    def of_task(self, task: str):
        """The encoder of ``task``'s rows: the shared adapter and ``task``'s active, then ``shared`` alone again."""
        self.activate([SHARED, task])
        try:
            yield
        finally:
            self.activate([SHARED])

    def parameters_of(self, name: str) -> list:
        """The parameters of adapter ``name`` (``shared``, a task's, or ``default`` for the one adapter)."""
        params = []
        for module in self.model.modules():
            # peft's tuner layers (adapter name -> its part), a name once (peft lists DoRA's magnitude twice)
            for attr in dict.fromkeys(getattr(module, "adapter_layer_names", ())):
                part = getattr(module, attr)
                if name in part:
                    params += list(part[name].parameters()) if isinstance(part[name], nn.Module) else [part[name]]
        return params

    def save(self, directory, link_weights_from=None) -> None:
        """The base as minBERT writes it (its own names: transformers and minBERT load it) and the
        adapter beside it as peft saves it (peft's model card left out: the checkpoint has its own);
        per task, a folder per adapter."""
        import peft

        directory = Path(directory)
        self.bert.save_pretrained(directory, link_weights_from, state_dict=peft.get_base_model_state_dict(self.model))
        remove_adapter(directory)  # adapters saved there before, of one or per task, are not these
        card = directory / "README.md"
        had_card = card.exists()
        self.model.save_pretrained(str(directory))
        if not had_card:
            card.unlink(missing_ok=True)


def has_adapter(path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def has_task_adapters(path) -> bool:
    """Whether checkpoint ``path`` holds one adapter per task (--peft-scope per-task)."""
    return has_adapter(Path(path) / SHARED) or (has_houlsby(path) and bool(saved_config(path)["tasks"]))


def remove_adapter(directory) -> None:
    """The adapters saved in checkpoint ``directory``, of any method and scope, removed."""
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, HOULSBY_CONFIG, HOULSBY_WEIGHTS):
        (Path(directory) / name).unlink(missing_ok=True)
    for config in Path(directory).glob(f"*/{ADAPTER_CONFIG}"):  # per task: a folder per adapter
        shutil.rmtree(config.parent)


def load_adapters(path, bert: nn.Module, tasks=()) -> tuple:
    """(``bert``, its adapters) for checkpoint ``path`` (``bert``: its base weights): Houlsby's and,
    where ``tasks`` are given, one per task read back unmerged; else the adapter saved there merged
    into ``bert`` (:func:`load_merged`, which refuses one per task), adapters None."""
    if has_houlsby(path) and (tasks or not has_task_adapters(path)):
        adapters = HoulsbyAdapters.load(path, bert, tasks)
    elif tasks and has_task_adapters(path):
        adapters = Adapters.load(path, bert, tasks)
    else:
        return load_merged(path, bert), None
    return adapters.bert, adapters


def load_merged(path, bert: nn.Module) -> nn.Module:
    """``bert`` (the base weights of checkpoint ``path``) with the adapter saved beside them merged
    into its weights (peft's ``merge_and_unload``): a plain minBERT. ``bert`` itself where ``path``
    holds no adapter."""
    if has_task_adapters(path):
        raise CheckpointError(f"{path} holds one adapter per task (--peft-scope per-task), no single encoder: "
                              f"MultitaskModel.from_pretrained loads it, each task's rows through its adapter")
    if has_houlsby(path):
        raise CheckpointError(f"{path} holds Houlsby adapters (--peft houlsby), which do not merge into the weights: "
                              f"load_adapters reads them back unmerged")
    if not has_adapter(path):
        return bert
    try:
        import peft
    except ImportError:
        raise CheckpointError(f"{path} holds a peft adapter ({ADAPTER_CONFIG}): pip install -e \".[peft]\" to "
                              f"load it, or load a merged checkpoint (--merge)") from None
    return peft.PeftModel.from_pretrained(bert, str(path)).merge_and_unload()


def adamw_state_bytes(params) -> int:
    """The size of AdamW's state for ``params``: two moments of each (its shape and dtype) and a
    step count (a float32 scalar per parameter, as torch's fused and foreach AdamW keep it)."""
    return sum(2 * p.numel() * p.element_size() + 4 for p in params)


def budget(module: nn.Module, optimizer) -> dict:
    """What training ``module`` costs: its parameters, those the optimiser trains, and the
    optimiser's state in MB (AdamW's, :func:`adamw_state_bytes`)."""
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    own = {id(p) for p in module.parameters()}
    every = [*module.parameters(), *(p for p in trained if id(p) not in own)]  # e.g. learned loss weights
    return {"params": sum(p.numel() for p in every), "trainable_params": sum(p.numel() for p in trained),
            "optimizer_state_mb": adamw_state_bytes(trained) / 2 ** 20}


def budget_line(sizes: dict, adapters=None) -> str:
    share = sizes["trainable_params"] / max(sizes["params"], 1)
    how = f" ({adapters.summary()}: {adapters.modules()} {adapters.WHAT})" if adapters else ""
    return (f"trains {sizes['trainable_params']:,} of {sizes['params']:,} parameters ({share:.2%}){how}; "
            f"AdamW's state {sizes['optimizer_state_mb']:,.1f} MB")
