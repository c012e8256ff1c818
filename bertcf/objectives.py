"""More self-supervised objectives for the first pretraining stage (``--stage mirror``):
``--method bsl|ct|tsdae|mlm``, beside Mirror-BERT / SimCSE (which live in contrastive.py).

Every objective is one small ``nn.Module`` that owns the encoder it trains (``.encoder``,
the one that is kept and evaluated) and every extra module its method needs (a predictor,
an EMA target, a second encoder copy, a decoder, an MLM head), so

- ``objective.trainable_parameters()`` is what the optimiser gets (a frozen EMA target is left out),
- ``objective.state_dict()`` is the whole training state of the method (for ``last/`` and --resume),
- ``objective.loss(ids, mask, special) -> (loss, scalars)`` is one training step's loss on a
  batch of the corpus; the objective makes its own views of it, drawing every random choice
  from the ``torch.Generator`` it was given (whose state the stage checkpoints, so a resumed
  run continues exactly); ``objective(...)`` is the same call (what DistributedDataParallel wraps),
- under torch.distributed, ``loss(ids, mask, special, rank=r, world=w)`` gets the *global* batch:
  the views are drawn for all of it (the generator advances alike on every rank, and as in one
  process), only rank r's rows are encoded, and the loss is scaled so that the mean over ranks
  (DDP's gradient averaging) is the loss of the whole batch; BSL's predictor normalises with the
  global batch's statistics (``GatheredBatchNorm1d``). With dropout 0, a data-parallel step is
  one process's step on the global batch (tests/test_distributed.py),
- ``objective.after_step()`` runs after each optimiser step (BSL's EMA update).

``OBJECTIVES`` maps the ``--method`` names to the classes; ``add_args`` and ``check_args``
hold their flags.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert import CheckpointError, pad_batch
from minbert.model import ACTIVATIONS, load_state_dict_file, resolve_checkpoint

from .contrastive import gather_with_grad, span_mask
from .encoder import SentenceEncoder, pool, resolve_encoder_path

IGNORE_INDEX = -100  # label of the positions a token cross-entropy skips

# Defaults of the flags below (also used when an objective is built from a partial ``args``).
DEFAULTS = {"momentum": 0.999, "predictor_k": 8, "predictor_hidden": None, "ct_negatives": 7, "deletion_ratio": 0.6,
            "decoder_layers": 2, "mlm_probability": 0.15, "span_p": 0.3, "span_cap": 5}


def _arg(args, name: str):
    value = getattr(args, name, None) if args is not None else None
    return DEFAULTS[name] if value is None else value


def add_args(parser) -> None:
    """The flags of the objectives (one argument group)."""
    g = parser.add_argument_group("bsl, ct, tsdae, mlm (--stage mirror)")
    g.add_argument("--momentum", type=float, default=DEFAULTS["momentum"],
                   help="bsl: EMA momentum of the target encoder (default %(default)s)")
    g.add_argument("--predictor-k", type=int, default=DEFAULTS["predictor_k"],
                   help="bsl: the predictor's hidden width is k * D, as in the BSL paper (default %(default)s)")
    g.add_argument("--predictor-hidden", type=int, default=None,
                   help="bsl: the predictor's hidden width, overriding --predictor-k")
    g.add_argument("--ct-negatives", type=int, default=DEFAULTS["ct_negatives"],
                   help="ct: negative pairs per positive pair (default %(default)s: 1 positive in 8 pairs)")
    g.add_argument("--deletion-ratio", type=float, default=DEFAULTS["deletion_ratio"],
                   help="tsdae: probability of deleting each token (default %(default)s)")
    g.add_argument("--decoder-layers", type=int, default=DEFAULTS["decoder_layers"],
                   help="tsdae: transformer decoder layers (default %(default)s)")
    g.add_argument("--mlm-probability", type=float, default=DEFAULTS["mlm_probability"],
                   help="mlm: share of tokens to predict (default %(default)s)")


def check_args(args) -> None:
    """Validate the flags of ``add_args`` (a bad value is a UsageError)."""
    from .training import UsageError

    if not 0 <= args.momentum < 1:
        raise UsageError(f"--momentum must be in [0, 1), not {args.momentum}")
    if args.predictor_k < 1:
        raise UsageError(f"--predictor-k must be at least 1, not {args.predictor_k}")
    if args.predictor_hidden is not None and args.predictor_hidden < 1:
        raise UsageError(f"--predictor-hidden must be at least 1, not {args.predictor_hidden}")
    if args.ct_negatives < 1:
        raise UsageError(f"--ct-negatives must be at least 1, not {args.ct_negatives}")
    if not 0 <= args.deletion_ratio < 1:
        raise UsageError(f"--deletion-ratio must be in [0, 1), not {args.deletion_ratio}")
    if args.decoder_layers < 1:
        raise UsageError(f"--decoder-layers must be at least 1, not {args.decoder_layers}")
    if not 0 < args.mlm_probability < 1:
        raise UsageError(f"--mlm-probability must be in (0, 1), not {args.mlm_probability}")


def maskable_positions(mask, special) -> torch.Tensor:
    """[b, t] bool: the real, non-special tokens (what an objective may mask or delete)."""
    return mask.bool() & ~special.bool()


def local_rows(b: int, rank: int = 0, world: int = 1) -> slice:
    """Rank ``rank``'s rows of a global batch of ``b`` (contiguous, as ``training.local_slice``)."""
    if b % world:
        raise ValueError(f"batch of {b} is not divisible by {world} processes")
    per = b // world
    return slice(rank * per, (rank + 1) * per)


def _world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


class GatheredBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d that, in training mode under torch.distributed, normalises with the statistics
    of the global batch: every rank's rows are gathered (``gather_with_grad``, so the gradient of
    every rank's loss reaches them), normalised together, and this rank's rows kept. Forward,
    running statistics and gradients are then one process's on the whole batch (``nn.SyncBatchNorm``
    does this on GPUs only). The parameters and buffers are BatchNorm1d's (same checkpoint keys).
    Every rank must pass the same number of rows."""

    def forward(self, x):
        if not self.training or _world_size() == 1:
            return super().forward(x)
        rank, b = torch.distributed.get_rank(), x.shape[0]
        return super().forward(gather_with_grad(x))[rank * b:(rank + 1) * b]


def _ensure_one(selected, maskable, generator) -> torch.Tensor:
    """Rows that have maskable tokens but none selected get one selected at random."""
    empty = (~selected.any(1) & maskable.any(1)).nonzero().flatten().tolist()
    for i in empty:
        positions = maskable[i].nonzero().flatten()
        selected[i, positions[int(torch.randint(len(positions), (1,), generator=generator))]] = True
    return selected


class Objective(nn.Module):
    """Base class. ``encoder``: the SentenceEncoder that is trained and kept; ``args``: the
    stage's flags (any object with the attributes of ``add_args``; missing ones take their
    defaults); ``generator``: the CPU torch.Generator of every random choice (views, pairs,
    deletions, masks)."""

    def __init__(self, encoder: SentenceEncoder, args=None, generator: torch.Generator | None = None):
        super().__init__()
        self.encoder = encoder
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        tokenizer = encoder.tokenizer
        self.mask_token_id = tokenizer.mask_token_id
        self.pad_token_id = tokenizer.pad_token_id

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def loss(self, ids, mask, special, rank: int = 0, world: int = 1) -> tuple[torch.Tensor, dict]:
        """ids, mask, special: CPU [B, t] (token ids; 1 = real token; 1 = [CLS]/[SEP]/padding),
        the global batch. ``rank``, ``world``: this process's share under torch.distributed
        (rows ``local_rows(B, rank, world)``); every random choice is drawn for all B rows,
        only this share is encoded, and the loss is scaled so that its mean over the ranks is
        the whole batch's. Returns the scalar float32 loss and a dict of detached scalars to log
        (this rank's rows)."""
        raise NotImplementedError

    def forward(self, ids, mask, special, rank: int = 0, world: int = 1):
        return self.loss(ids, mask, special, rank, world)

    def after_step(self) -> None:
        """Called after every optimiser step."""


class BSL(Objective):
    """Bootstrapped sentence representation learning (Zhang et al. 2021, "Bootstrapped
    Unsupervised Sentence Representation Learning", ACL; BYOL, Grill et al. 2020, for text).

    Two views of each sentence: v1 = the sentence, v2 = one token span replaced by [MASK]
    (``span_mask``, --span-p / --span-cap); both go through dropout. The online encoder f
    (``encoder``, kept) and a predictor q (three linear layers D -> kD -> kD -> D with BatchNorm and
    ReLU between them, k = 8 as in the BSL paper; --predictor-k, --predictor-hidden) predict
    the target encoder's embedding of the other view; the target f_xi (``target``) is an
    exponential moving average of f, xi <- m xi + (1 - m) theta after every step (--momentum),
    and gets no gradient. It runs in the same train/eval mode as f (its dropout is part of
    the views). The predictor's BatchNorm normalises each view over the global batch under
    torch.distributed (``GatheredBatchNorm1d``; BYOL's cross-replica BatchNorm). With
    g(a, b) = 2 - 2 cos(a, b), per sentence [b]:

        L = g(q(f(v1)), sg f_xi(v2)) + g(q(f(v2)), sg f_xi(v1)),   loss = mean over the batch.

    No negatives. Shapes: f(v) [b, D] (the encoder's pooling), q: [b, D] -> [b, H] -> [b, H] -> [b, D].
    """

    def __init__(self, encoder, args=None, generator=None):
        super().__init__(encoder, args, generator)
        d = encoder.dim
        hidden = _arg(args, "predictor_hidden") or _arg(args, "predictor_k") * d
        self.momentum = float(_arg(args, "momentum"))
        self.span_p, self.span_cap = _arg(args, "span_p"), _arg(args, "span_cap")
        self.predictor = nn.Sequential(nn.Linear(d, hidden), GatheredBatchNorm1d(hidden), nn.ReLU(inplace=True),
                                       nn.Linear(hidden, hidden), GatheredBatchNorm1d(hidden), nn.ReLU(inplace=True),
                                       nn.Linear(hidden, d))
        self.target = copy.deepcopy(encoder.bert).requires_grad_(False)

    def views(self, ids, mask, special) -> torch.Tensor:
        """The second view: a copy of ids with one span per sentence masked."""
        return span_mask(ids, mask, special, self.mask_token_id, self.span_p, self.span_cap, self.generator)

    @staticmethod
    def regression(prediction, target) -> torch.Tensor:
        """2 - 2 cos per row, [b]."""
        return 2 - 2 * F.cosine_similarity(prediction.float(), target.float(), dim=-1)

    def loss(self, ids, mask, special, rank=0, world=1):
        masked = self.views(ids, mask, special)
        rows = local_rows(ids.shape[0], rank, world)
        ids, masked, mask = ids[rows], masked[rows], mask[rows]
        both = torch.cat([ids, masked]).to(self.device)
        both_mask = torch.cat([mask, mask]).to(self.device)
        o1, o2 = self.encoder.embed(both, both_mask).chunk(2)
        p1, p2 = self.predictor(o1), self.predictor(o2)  # BatchNorm statistics per view, as in BYOL
        with torch.no_grad():
            t1, t2 = pool(self.target(both, both_mask)["last_hidden_state"], both_mask,
                          self.encoder.pooling).chunk(2)
        per_row = self.regression(p1, t2) + self.regression(p2, t1)
        with torch.no_grad():
            scalars = {"prediction_cosine": 1 - per_row.mean() / 4,
                       "view_cosine": F.cosine_similarity(o1.float(), o2.float(), dim=-1).mean()}
        return per_row.mean(), scalars

    @torch.no_grad()
    def after_step(self) -> None:
        """xi <- m xi + (1 - m) theta for every parameter; buffers are copied."""
        for target, online in zip(self.target.parameters(), self.encoder.bert.parameters()):
            target.lerp_(online.detach(), 1 - self.momentum)
        for target, online in zip(self.target.buffers(), self.encoder.bert.buffers()):
            target.copy_(online)


class ContrastiveTension(Objective):
    """Contrastive Tension (Carlsson et al. 2021, "Semantic Re-tuning with Contrastive
    Tension", ICLR).

    Two copies of the encoder, identical at the start and trained independently: f1
    (``encoder``, kept) and f2 (``second``). A batch of b sentences gives b pairs (A_i, B_i):
    A_i = sentence i; every (k + 1)-th pair (i % (k + 1) == 0, k = --ct-negatives) is a positive
    with B_i = A_i and label 1, the others take another sentence of the batch, drawn uniformly,
    with label 0 (one positive per 8 pairs by default). With s_i = f1(A_i) . f2(B_i) [b]:

        loss = mean_i BCEWithLogits(s_i, y_i).

    (sentence-transformers' ContrastiveTensionLoss sums over the batch; the mean keeps the
    learning rate independent of the batch size.)
    """

    def __init__(self, encoder, args=None, generator=None):
        super().__init__(encoder, args, generator)
        self.negatives = int(_arg(args, "ct_negatives"))
        self.second = copy.deepcopy(encoder.bert).requires_grad_(True)

    def pairs(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(partner [b] long, labels [b] float): B_i = sentence partner[i]."""
        rows = torch.arange(b)
        labels = (rows % (self.negatives + 1) == 0).float()
        other = torch.randint(0, max(b - 1, 1), (b,), generator=self.generator)
        other = other + (other >= rows).long()  # uniform over the b - 1 other sentences
        partner = torch.where(labels.bool() | (b < 2), rows, other)
        return partner, labels

    def loss(self, ids, mask, special, rank=0, world=1):
        partner, labels = self.pairs(ids.shape[0])  # over the global batch: B_i may be another rank's row
        rows = local_rows(ids.shape[0], rank, world)
        partner, labels = partner[rows], labels[rows]
        a = self.encoder.embed(ids[rows].to(self.device), mask[rows].to(self.device))
        b_ids, b_mask = ids[partner].to(self.device), mask[partner].to(self.device)
        b = pool(self.second(b_ids, b_mask)["last_hidden_state"], b_mask, self.encoder.pooling)
        logits = (a.float() * b.float()).sum(-1)
        labels = labels.to(logits.device)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        with torch.no_grad():
            pos, neg = labels.bool(), ~labels.bool()
            scalars = {"pos_logit": logits[pos].mean(), "neg_logit": logits[neg].mean() if neg.any() else logits.new_zeros(()),
                       "pair_accuracy": ((logits > 0).float() == labels).float().mean()}
        return loss, scalars


class TSDAEDecoder(nn.Module):
    """The decoder of TSDAE: a post-LayerNorm transformer decoder (``torch.nn.TransformerDecoder``,
    BERT-sized layers: the encoder's D, heads, feed-forward width, GELU, dropout) whose
    cross-attention sees one memory vector per sentence.

    forward(hidden [b, t, D] (embedded decoder input), memory [b, D], word_embeddings [V, D])
    -> logits [b, t, V] = decoder(hidden | memory) @ word_embeddings^T + bias. Causal
    self-attention; right padding needs no key-padding mask under it.
    """

    def __init__(self, config, num_layers: int):
        super().__init__()
        layer = nn.TransformerDecoderLayer(config.hidden_size, config.num_attention_heads, config.intermediate_size,
                                           dropout=config.hidden_dropout_prob, activation="gelu",
                                           layer_norm_eps=config.layer_norm_eps, batch_first=True, norm_first=False)
        self.layers = nn.TransformerDecoder(layer, num_layers)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # nn.TransformerDecoder clones one layer: give every layer its own BERT-style initialisation.
        for name, p in self.layers.named_parameters():
            if "norm" in name:
                continue
            if p.ndim >= 2:
                nn.init.normal_(p, std=config.initializer_range)
            else:
                nn.init.zeros_(p)

    def forward(self, hidden, memory, word_embeddings):
        t = hidden.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=hidden.device, dtype=hidden.dtype)
        h = self.layers(hidden, memory.unsqueeze(1).to(hidden.dtype), tgt_mask=causal, tgt_is_causal=True)
        return F.linear(h, word_embeddings, self.bias)


def kept_fraction(damaged_mask, mask, special) -> torch.Tensor:
    """Share of the non-special tokens that survived the deletion."""
    specials = (mask.bool() & special.bool()).sum()
    return (damaged_mask.sum() - specials.to(damaged_mask.device)) / maskable_positions(mask, special).sum().clamp_min(1)


class TSDAE(Objective):
    """Transformer-based Sequential Denoising Auto-Encoder (Wang et al. 2021, "TSDAE: Using
    Transformer-based Sequential Denoising Auto-Encoder for Unsupervised Sentence Embedding
    Learning", Findings of EMNLP).

    Noise: every non-special token is deleted with probability r (--deletion-ratio, 0.6;
    a sentence keeps at least one; [CLS]/[SEP] stay) -> damaged ids [b, t'] (t' <= t).
    The encoder maps the damaged sentence to its pooled vector u [b, D]; a transformer decoder
    (``decoder``, --decoder-layers) reconstructs the original with teacher forcing: its input
    is ids[:, :-1] embedded by the encoder's own embedding layer (word embeddings tied), its
    cross-attention sees only u, its output projection is the word-embedding matrix (tied) plus
    a bias, and it predicts ids[:, 1:]:

        loss = token cross-entropy over the real target tokens (padding ignored).
    """

    def __init__(self, encoder, args=None, generator=None):
        super().__init__(encoder, args, generator)
        self.deletion_ratio = float(_arg(args, "deletion_ratio"))
        self.decoder = TSDAEDecoder(encoder.bert.config, int(_arg(args, "decoder_layers")))

    def delete(self, ids, mask, special) -> tuple[torch.Tensor, torch.Tensor]:
        """The damaged batch (ids, mask), right-padded to its longest sentence."""
        maskable = maskable_positions(mask, special)
        keep = (torch.rand(ids.shape, generator=self.generator) >= self.deletion_ratio) & maskable
        keep = _ensure_one(keep, maskable, self.generator)
        keep |= mask.bool() & special.bool()  # [CLS] and [SEP]
        return pad_batch([row[k].tolist() for row, k in zip(ids, keep)], self.pad_token_id)

    def loss(self, ids, mask, special, rank=0, world=1):
        damaged, damaged_mask = self.delete(ids, mask, special)
        count = max(int(mask[:, 1:].sum()), 1)  # target tokens of the global batch
        rows = local_rows(ids.shape[0], rank, world)
        ids, mask, special, damaged, damaged_mask = (x[rows] for x in (ids, mask, special, damaged, damaged_mask))
        u = self.encoder.embed(damaged.to(self.device), damaged_mask.to(self.device))
        original, original_mask = ids.to(self.device), mask.to(self.device)
        inputs = original[:, :-1]
        labels = original[:, 1:].masked_fill(original_mask[:, 1:] == 0, IGNORE_INDEX)
        embeddings = self.encoder.bert.embeddings
        hidden = embeddings(inputs, torch.zeros_like(inputs))
        logits = self.decoder(hidden, u, embeddings.word_embeddings.weight).float()
        # The mean over the global batch's target tokens (a rank's share of it under DDP).
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum") * (world / count)
        with torch.no_grad():
            valid = labels != IGNORE_INDEX
            scalars = {"token_accuracy": (logits.argmax(-1) == labels)[valid].float().mean(),
                       "kept_fraction": kept_fraction(damaged_mask, mask, special)}
        return loss, scalars


class MLMHead(nn.Module):
    """BERT's masked-LM prediction head (Hugging Face names, under ``cls.predictions.``):
    transform = dense D x D, activation, LayerNorm; decoder = the word embeddings (tied) + bias.

    forward(hidden [n, D], word_embeddings [V, D]) -> logits [n, V]."""

    def __init__(self, config):
        super().__init__()
        self.transform = nn.Module()
        self.transform.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.act = ACTIVATIONS[config.hidden_act]
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        nn.init.normal_(self.transform.dense.weight, std=config.initializer_range)
        nn.init.zeros_(self.transform.dense.bias)

    def forward(self, hidden, word_embeddings):
        h = self.transform.LayerNorm(self.act(self.transform.dense(hidden)))
        return F.linear(h, word_embeddings, self.bias)

    def load_checkpoint_tensors(self, state_dict: dict, source: str = "checkpoint") -> bool:
        """Copy ``cls.predictions.*`` of a BertForMaskedLM / BertForPreTraining state dict;
        False (head left as it is) when the checkpoint has no complete head."""
        prefix = "cls.predictions."
        found = {}
        for key, tensor in state_dict.items():
            if key.startswith(prefix):
                name = key[len(prefix):].replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
                found[name] = tensor
        if "bias" not in found and "decoder.bias" in found:
            found["bias"] = found["decoder.bias"]
        own = self.state_dict()
        if not set(own) <= set(found):
            return False
        bad = [f"{k} {tuple(found[k].shape)} != {tuple(v.shape)}" for k, v in own.items() if found[k].shape != v.shape]
        if bad:
            raise CheckpointError(f"the MLM head of {source} does not fit the encoder ({'; '.join(bad)})")
        self.load_state_dict({k: found[k].to(v.dtype) for k, v in own.items()})
        return True


class MaskedLM(Objective):
    """Masked language modelling for domain adaptation (Devlin et al. 2019, "BERT"; as
    continued pretraining: Gururangan et al. 2020, "Don't Stop Pretraining").

    Each non-special token is selected with probability p (--mlm-probability, 0.15; at least
    one per sentence); a selected token becomes [MASK] with probability 0.8, a random
    vocabulary token with 0.1, and stays itself with 0.1. The encoder's last layer at the
    selected positions [n, D] goes through ``head`` (``MLMHead``, initialised from the
    checkpoint's ``cls.predictions.*`` when it has them, else fresh) -> logits [n, V]:

        loss = cross-entropy of the original tokens at the selected positions only.
    """

    def __init__(self, encoder, args=None, generator=None, checkpoint=None):
        super().__init__(encoder, args, generator)
        self.probability = float(_arg(args, "mlm_probability"))
        config = encoder.bert.config
        self.vocab_size = config.vocab_size
        self.head = MLMHead(config)
        if checkpoint is None and args is not None:
            checkpoint = getattr(args, "init", None) or getattr(args, "model", None)
        self.head_from_checkpoint = self.init_head(checkpoint) if checkpoint is not None else False

    def init_head(self, checkpoint) -> bool:
        """Initialise the head from ``checkpoint`` (directory, hub name or run directory)."""
        _, weights = resolve_checkpoint(resolve_encoder_path(checkpoint))
        loaded = self.head.load_checkpoint_tensors(load_state_dict_file(weights), source=str(checkpoint))
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_rank() != 0):  # one line a run, not one a rank
            how = "initialised from" if loaded else "freshly initialised; no cls.predictions in"
            print(f"mlm: prediction head {how} {checkpoint}")
        return loaded

    def mask_tokens(self, ids, mask, special) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [b, t], labels [b, t]): labels hold the original id at the selected
        positions and IGNORE_INDEX elsewhere."""
        maskable = maskable_positions(mask, special)
        selected = (torch.rand(ids.shape, generator=self.generator) < self.probability) & maskable
        selected = _ensure_one(selected, maskable, self.generator)
        action = torch.rand(ids.shape, generator=self.generator)
        random_ids = torch.randint(self.vocab_size, ids.shape, generator=self.generator)
        inputs = torch.where(selected & (action < 0.8), self.mask_token_id, ids)
        inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
        labels = torch.where(selected, ids, IGNORE_INDEX)
        return inputs, labels

    def loss(self, ids, mask, special, rank=0, world=1):
        inputs, labels = self.mask_tokens(ids, mask, special)
        count = max(int((labels != IGNORE_INDEX).sum()), 1)  # selected tokens of the global batch
        rows = local_rows(ids.shape[0], rank, world)
        inputs, mask, labels = inputs[rows].to(self.device), mask[rows].to(self.device), labels[rows].to(self.device)
        hidden = self.encoder.bert(inputs, mask)["last_hidden_state"]
        selected = labels != IGNORE_INDEX
        logits = self.head(hidden[selected], self.encoder.bert.embeddings.word_embeddings.weight).float()
        targets = labels[selected]
        loss = F.cross_entropy(logits, targets, reduction="sum") * (world / count)  # the global batch's mean
        with torch.no_grad():
            scalars = {"mlm_accuracy": (logits.argmax(-1) == targets).float().mean(),
                       "masked_fraction": selected.sum() / mask.sum()}
        return loss, scalars


OBJECTIVES = {"bsl": BSL, "ct": ContrastiveTension, "tsdae": TSDAE, "mlm": MaskedLM}


def build_objective(method: str, encoder: SentenceEncoder, args=None, generator=None) -> Objective:
    """The objective of ``--method`` (a key of OBJECTIVES)."""
    return OBJECTIVES[method](encoder, args, generator)
