"""Mirror-BERT and SimCSE: contrastive pretraining of the encoder on two views of each sentence."""
from __future__ import annotations

import torch
import torch.nn as nn

from minbert import pad_batch

from ..errors import UsageError
from ..utils.distributed import local_rows
from .base import Objective, pair_scalars
from .contrastive import InfoNCE, char_span_mask, span_mask
from .settings import InfoNCESettings, MatryoshkaSettings, SpanSettings

#: SimCSE's views (unsupervised SimCSE, and --stage joint --method simcse): no span, so the two
#: views of a sentence differ by dropout alone.
SIMCSE_VIEWS = {"span_cap": 0, "span_unit": "token"}


def simcse_mlp(encoder, mlp: bool):
    """SimCSE's training head (``mlp``; ``--pooling cls-mlp``): a [D, D] linear layer and tanh over
    [CLS] (BERT's pooler initialisation); None without it. The head reads [CLS], and the encoder
    evaluated and saved without it must give [CLS] too, so it must pool ``cls`` already: its
    pooling is the caller's choice (``run_pretrain.py --pooling cls-mlp`` builds it so), not
    changed here behind the caller's back."""
    if not mlp:
        return None
    if encoder.pooling != "cls":
        raise UsageError(f"mlp=True (SimCSE's MLP over [CLS], --pooling cls-mlp) needs an encoder that pools cls, "
                         f"not {encoder.pooling}: SentenceEncoder.from_pretrained(..., pooling=\"cls\")")
    d, std = encoder.dim, encoder.bert.config.initializer_range
    mlp = nn.Sequential(nn.Linear(d, d), nn.Tanh())
    nn.init.normal_(mlp[0].weight, std=std)
    nn.init.zeros_(mlp[0].bias)
    return mlp


class Mirror(Objective):
    """Mirror-BERT (Liu et al. 2021, "Fast, Effective, and Self-Supervised: Transforming Masked
    Language Models into Universal Lexical and Sentence Encoders", EMNLP).

    Two views of each sentence x: x itself and x' = x with one span replaced by [MASK], both
    through the encoder with dropout, in one forward pass of 2b rows (dropout masks differ per
    row, so the views are independent). The span (``--span-unit``): ``token``, the report's, a span
    of tokens with length ~ Geometric(--span-p) capped at --span-cap (``span_mask``); or ``char``,
    Mirror-BERT's released code, --span-chars characters of the raw text, in sentences of 30
    characters or more (``char_span_mask``; the view is then tokenised from the masked text).
    With u = f(x), u' = f(x') [b, D]:

        loss = InfoNCE(u, u') (cosine / --temperature; candidates by --negatives: the report's 2b - 1
        one-sided, SimCSE's b, or Mirror-BERT's NT-Xent over the 2b views; under torch.distributed
        the candidates come from the global batch).

    Settings: ``SpanSettings``, ``InfoNCESettings`` and ``MatryoshkaSettings`` (the loss at several
    widths; ``objectives.settings``); ``mlp=True``
    (``--pooling cls-mlp``, SimCSE's training head): u = tanh(W [CLS] + c), an MLP the objective
    owns; evaluation and the checkpoint use [CLS] without it (the encoder pools ``cls``).
    ``max_length``: the tokens of a view made on the text (``--span-unit char``; the run's
    ``max_length``).

    --mini-batch-size M: the 2b views go through the encoder M at a time, with the gradient cache
    (``objectives.cache``); the spans are drawn before, the MLP and the loss run on all 2b vectors.
    """

    mini_batches = True
    SETTINGS = (SpanSettings, InfoNCESettings, MatryoshkaSettings)
    RUN_SETTINGS = ("mlp", "max_length")

    def __init__(self, encoder, *, mlp: bool = False, max_length: int = 32, generator=None, mini_batch_size=None,
                 **settings):
        super().__init__(encoder, generator=generator, mini_batch_size=mini_batch_size, **settings)
        s = self.settings
        self.span_p, self.span_cap, self.span_unit, self.span_chars = s.span_p, s.span_cap, s.span_unit, s.span_chars
        self.max_length = max_length
        self.info_nce = InfoNCE(temperature=s.temperature, negatives=s.negatives)
        self.mlp = simcse_mlp(encoder, mlp)
        self.matryoshka_widths(encoder.output_dim)

    @property
    def needs_text(self) -> bool:
        return self.span_unit == "char"

    def views(self, ids, mask, special, rank: int, world: int, texts=None) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the two views, u and u' [b, D] (after the MLP with cls-mlp). The spans
        are drawn for the whole global batch, so the generator advances alike on every rank (and as
        in one process)."""
        rows = local_rows(ids.shape[0], rank, world)
        if self.span_unit == "char":
            masked_texts = [char_span_mask(t, self.span_chars, self.encoder.tokenizer.mask_token, self.generator)
                            for t in texts]
            local = texts[rows] + masked_texts[rows]
            tokens = self.encoder.tokenizer(local, truncation=True, max_length=self.max_length)["input_ids"]
            both, both_mask = pad_batch(tokens, self.pad_token_id)
        else:
            masked = span_mask(ids, mask, special, self.mask_token_id, self.span_p, self.span_cap, self.generator)
            ids, masked, mask = ids[rows], masked[rows], mask[rows]
            both, both_mask = torch.cat([ids, masked]), torch.cat([mask, mask])
        u = self.embed(both, both_mask)
        return (self.mlp(u) if self.mlp is not None else u).chunk(2)

    def checkpoint_modules(self):
        return {"encoder": self.encoder} | ({"mlp": self.mlp} if self.mlp is not None else {})

    def loss(self, ids, mask, special, rank=0, world=1, texts=None):
        u, u_masked = self.views(ids, mask, special, rank, world, texts)
        return self.at_widths(lambda v, _: self.info_nce(*v), [u, u_masked]), pair_scalars(u, u_masked)


class SimCSE(Mirror):
    """Unsupervised SimCSE (Gao et al. 2021, "SimCSE: Simple Contrastive Learning of Sentence
    Embeddings", EMNLP): Mirror-BERT without the span, so the two views differ by dropout only:
    its ``span_cap`` is 0 and its ``span_unit`` token (``SIMCSE_VIEWS``, what its description
    records), and another value is refused, not overridden. SimCSE's published loss and head are
    --negatives simcse --pooling cls-mlp (``--preset simcse-unsup``)."""

    @classmethod
    def check_settings(cls, settings: dict):
        settings = SIMCSE_VIEWS | settings
        for name, value in SIMCSE_VIEWS.items():
            if settings[name] != value:
                raise UsageError(f"SimCSE's two views differ by dropout alone: {name} must be {value!r}, not "
                                 f"{settings[name]!r} (Mirror masks a span)")
        return super().check_settings(settings)
