"""The shape every pretraining objective has (``Objective``: built from an encoder and keyword
settings) and the helpers several of them use."""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UsageError
from ..models.encoder import SentenceEncoder
from ..settings import Settings
from .cache import embed_in_chunks

IGNORE_INDEX = -100  # label of the positions a token cross-entropy skips


def maskable_positions(mask, special) -> torch.Tensor:
    """[b, t] bool: the real, non-special tokens (what an objective may mask or delete)."""
    return mask.bool() & ~special.bool()


def ensure_one(selected, maskable, generator) -> torch.Tensor:
    """Rows that have maskable tokens but none selected get one selected at random."""
    empty = (~selected.any(1) & maskable.any(1)).nonzero().flatten().tolist()
    for i in empty:
        positions = maskable[i].nonzero().flatten()
        selected[i, positions[int(torch.randint(len(positions), (1,), generator=generator))]] = True
    return selected


@torch.no_grad()
def pair_scalars(a, b) -> dict:
    """Mean cosine of the positive pairs (row i of a and b) and of all other pairs in the batch."""
    cos = torch.nn.functional.normalize(a.float(), dim=-1) @ torch.nn.functional.normalize(b.float(), dim=-1).T
    n = cos.shape[0]
    return {"pos_cosine": cos.diagonal().mean(), "neg_cosine": (cos.sum() - cos.diagonal().sum()) / (n * n - n)}


class BaseObjective(nn.Module):
    """What a ``Trainer`` trains: a module that owns the encoder it trains (``encoder``) and gives
    one step's loss. ``Objective`` (one method) and ``Mixture`` (several methods, each on its
    dataset) both have this shape, and the Trainer reads nothing else:

    - ``objective(ids, mask, special, rank, world, ...) -> (loss, scalars)``: one step's loss;
    - ``parameter_groups()``: what the optimiser gets (groups may carry their own "lr");
    - ``checkpoint_modules()``: name -> module whose state ``last/training_state.pt`` keeps;
    - ``generators()``: name -> the torch.Generator whose state a checkpoint keeps;
    - ``after_step()``: runs after every optimiser step (BSL's EMA update);
    - ``heldout_metrics(ids, mask, special)``: its own metrics on held-out sentences (MLM's accuracy);
    - ``evaluation_metrics()``: metrics of its own logged with every evaluation;
    - ``description()``: what it is, with its settings (config.json from the Python API).

    ``needs_text``: the step also takes the batch's raw sentences (``texts``); ``uses_flow``:
    whether the encoder keeps its flow."""

    encoder: SentenceEncoder
    uses_flow = False
    needs_text = False

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    @property
    def encoder_frozen(self) -> bool:
        """True when no encoder weight trains (the joint and flow stages): its weights never change."""
        return not any(p.requires_grad for p in self.encoder.bert.parameters())

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def parameter_groups(self) -> list[dict]:
        return [{"params": self.trainable_parameters()}]

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        return {"objective": self}

    def generators(self) -> dict[str, torch.Generator]:
        raise NotImplementedError

    def after_step(self) -> None:
        """Called after every optimiser step."""

    def heldout_metrics(self, ids, mask, special) -> dict:
        """Its own metrics on a held-out batch (CPU [b, t], as for a step), logged with every
        evaluation; none by default."""
        return {}

    def evaluation_metrics(self) -> dict:
        """Metrics of its own logged with every evaluation (a mixture's per-dataset losses); none."""
        return {}

    def description(self) -> dict:
        raise NotImplementedError


class Objective(BaseObjective):
    """One pretraining method, as one ``nn.Module`` that owns the encoder it trains (``encoder``,
    the one that is kept and evaluated) and every extra module its method needs.

    Built from ``encoder`` (a SentenceEncoder) and keyword settings: the fields of the families in
    ``SETTINGS`` (``objectives.settings``; e.g. ``Mirror(encoder, temperature=0.05)``), each
    checked as its flag is, and an objective's own keywords. ``generator``: the CPU torch.Generator
    of every random choice (views, pairs, deletions, masks); the Trainer seeds it with the run's
    seed and checkpoints its state, so a resumed run continues exactly. ``mini_batch_size``: the
    gradient cache, where ``mini_batches`` allows it. Its step's loss is ``loss``; the rest of its
    shape is ``BaseObjective``'s.

    ``needs_text``: the objective also takes the batch's raw sentences (``texts``: a list of b
    strings), for views made on the text itself (Mirror-BERT's character span).

    The encoder given is the encoder that trains: an objective changes none of its settings.
    What a method needs of it is checked, and a mismatch refused in one line; the caller builds
    the encoder to fit (``training.pretraining.load_encoder`` does for ``run_pretrain.py``):

    ``uses_flow``: whether the method trains a flow on the encoder (the joint and flow stages,
    which attach one when the encoder has none); the other objectives train the encoder itself
    and refuse an encoder with a flow (``run_pretrain.py`` drops the one ``--init`` carries).

    ``uses_dense``: whether the method trains the encoder's linear head (``SentenceEncoder.dense``,
    e.g. a whitening map); the others train f(x), which the head was fitted to, and refuse an
    encoder with one (``run_pretrain.py`` drops it, with a note: refit it on the new encoder,
    ``--stage whiten``).

    Matryoshka's widths (``matryoshka_dims``) are checked against the vectors' width; the
    ``Trainer`` records them in the checkpoints it writes.

    ``mini_batches``: whether ``--mini-batch-size`` (``mini_batch_size``) applies: every sentence
    vector the loss reads comes from ``embed`` or ``embed_rows``, which then embed M rows at a
    time and cache the loss's gradient on the vectors (``objectives.cache``); what the loss
    computes from the vectors is unchanged. An objective opts in by setting it and routing its
    encoders' forward passes through those two methods (its random choices drawn for the whole
    batch before them)."""

    uses_dense = False
    mini_batches = False
    no_duplicates = False  # batches without a repeated text by default (``TrainConfig.batch_sampler``)
    SETTINGS: tuple[type[Settings], ...] = ()  # the families of settings this objective takes
    #: Its own keywords that a pretraining run fills from the run's settings (``training.pretraining``):
    #: mlp (--pooling cls-mlp), max_length (--max-length), checkpoint (--init or --model).
    RUN_SETTINGS: tuple[str, ...] = ()

    def __init__(self, encoder: SentenceEncoder, *, generator: torch.Generator | None = None,
                 mini_batch_size: int | None = None, **settings):
        super().__init__()
        self.settings = self.check_settings(settings)
        name = type(self).__name__
        if encoder.flow is not None and not self.uses_flow:
            raise UsageError(f"{name} trains the encoder itself, not a flow on it: give it an encoder without a flow "
                             f"(encoder.flow = None)")
        if encoder.dense is not None and not self.uses_dense:
            raise UsageError(f"{name} changes the vectors the encoder's linear head ({encoder.dim} -> "
                             f"{encoder.dense.out_features}, e.g. a whitening map) was fitted on: give it an encoder "
                             f"without one (encoder.dense = None) and refit the head afterwards (--stage whiten)")
        self.encoder = encoder
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        tokenizer = encoder.tokenizer
        self.mask_token_id = tokenizer.mask_token_id
        self.pad_token_id = tokenizer.pad_token_id
        self.mini_batch_size = mini_batch_size
        if self.mini_batch_size and not self.mini_batches:
            raise UsageError(f"--mini-batch-size does not apply to {type(self).__name__}")

    @classmethod
    def setting_names(cls) -> tuple[str, ...]:
        return tuple(name for family in cls.SETTINGS for name in family.names())

    @classmethod
    def check_settings(cls, settings: dict) -> SimpleNamespace:
        """``settings`` (keyword arguments) as the families of ``SETTINGS`` check them, every
        field the families have filled in with its default."""
        unknown = sorted(set(settings) - set(cls.setting_names()))
        if unknown:
            raise UsageError(f"{cls.__name__} has no setting {', '.join(unknown)} (its settings: "
                             f"{', '.join(cls.setting_names()) or 'none'})")
        values = {}
        for family in cls.SETTINGS:
            values |= family(**family.pick(settings)).to_dict()
        return SimpleNamespace(**values)

    def matryoshka_widths(self, width: int) -> None:
        """Check --matryoshka-dims (``matryoshka_dims``, when this objective takes them) against
        ``width``, the vectors' width. The encoder is not touched: the ``Trainer`` records the
        widths in the checkpoints it writes (``training.trainer.trained_widths``)."""
        dims = getattr(self.settings, "matryoshka_dims", None)
        if dims and max(dims) > width:
            raise UsageError(f"--matryoshka-dims {max(dims)} is wider than the {width} dimensions of "
                             f"{type(self).__name__}'s vectors")

    def at_widths(self, loss_fn, vectors: list[torch.Tensor], labels=None) -> torch.Tensor:
        """``loss_fn(vectors, labels)``, or with --matryoshka-dims the weighted sum of it over the
        widths, as sentence-transformers' MatryoshkaLoss computes it: at width k each vector's first
        k dimensions, L2-normalised, and labels that are vectors of the same width (a teacher's)
        cut to their first k."""
        dims = getattr(self.settings, "matryoshka_dims", None)
        if not dims:
            return loss_fn(vectors, labels)
        weights = self.settings.matryoshka_weights or (1.0,) * len(dims)
        cut = labels is not None and labels.ndim >= 2 and labels.shape[-1] == vectors[0].shape[-1]
        return sum(w * loss_fn([F.normalize(v[..., :k], dim=-1) for v in vectors], labels[..., :k] if cut else labels)
                   for k, w in zip(dims, weights))

    def description(self) -> dict:
        """What the objective is, with its settings (a run's config.json from the Python API)."""
        return {"objective": type(self).__name__, **vars(self.settings)}

    def embed(self, ids, mask) -> torch.Tensor:
        """f(x) [b, D] of a host batch, on the encoder's device (``embed_rows``). No graph through
        a frozen encoder."""
        return self.embed_rows(self._encoder_embed, ids, mask, trainable=not self.encoder_frozen)

    def _encoder_embed(self, ids, mask, num_tokens):
        return self.encoder.embed(ids, mask, num_tokens=num_tokens)

    def embed_rows(self, embed, ids, mask, trainable: bool = True) -> torch.Tensor:
        """``embed(ids, mask, num_tokens) -> [b, D]`` of host ``ids``, ``mask`` [b, t], on the
        encoder's device; the mask's sum is counted on the host, so the unpadded encoder needs no
        GPU sync. ``trainable``: whether what ``embed`` runs trains (else no graph). With
        --mini-batch-size M and more than M rows: M rows at a time, with the gradient cache when
        there is a gradient to take (``objectives.cache``)."""
        grad = torch.is_grad_enabled() and trainable
        with torch.set_grad_enabled(grad):
            if self.mini_batch_size and ids.shape[0] > self.mini_batch_size:
                return embed_in_chunks(embed, ids, mask, self.mini_batch_size, self.device, cache=grad)
            num_tokens = int(mask.sum())
            ids, mask = ids.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)
            return embed(ids, mask, num_tokens)

    def loss(self, ids, mask, special, rank: int = 0, world: int = 1, texts=None) -> tuple[torch.Tensor, dict]:
        """ids, mask, special: CPU [B, t] (token ids; 1 = real token; 1 = [CLS]/[SEP]/padding),
        the global batch; ``texts``: its B sentences (given when ``needs_text``). ``rank``, ``world``: this process's share under torch.distributed
        (rows ``local_rows(B, rank, world)``); every random choice is drawn for all B rows,
        only this share is encoded, and the loss is scaled so that its mean over the ranks is
        the whole batch's. Returns the scalar float32 loss and a dict of detached scalars to log
        (this rank's rows)."""
        raise NotImplementedError

    def forward(self, ids, mask, special, rank: int = 0, world: int = 1, texts=None):
        if self.needs_text:
            return self.loss(ids, mask, special, rank, world, texts=texts)
        return self.loss(ids, mask, special, rank, world)

    def generators(self) -> dict[str, torch.Generator]:
        """The generators of its random choices, by the name a checkpoint keeps their state under."""
        return {"span": self.generator}
