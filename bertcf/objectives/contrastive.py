"""Token-span masking and the InfoNCE loss of Mirror-BERT / SimCSE.

Mirror-BERT: Liu et al. 2021, "Fast, Effective, and Self-Supervised: Transforming Masked
Language Models into Universal Lexical and Sentence Encoders". SimCSE: Gao et al. 2021,
"SimCSE: Simple Contrastive Learning of Sentence Embeddings".
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..utils.distributed import dist_info, gather_with_grad


def sample_span_lengths(n: int, p: float, cap: int, generator=None) -> torch.Tensor:
    """n span lengths ~ Geometric(p) on {1, 2, ...}, capped at ``cap`` (cap 0: no span)."""
    if cap <= 0:
        return torch.zeros(n, dtype=torch.long)
    u = torch.rand(n, generator=generator, dtype=torch.float64).clamp_min(1e-12)
    # Inverse CDF of the geometric distribution: P(L > k) = (1 - p)^k.
    lengths = torch.ones(n, dtype=torch.long) if p >= 1 else torch.ceil(torch.log(u) / torch.log1p(torch.tensor(-p, dtype=torch.float64))).long().clamp_min(1)
    return lengths.clamp_max(cap)


def span_mask(input_ids, attention_mask, special_tokens_mask, mask_token_id: int, p: float = 0.3,
              cap: int = 5, generator=None) -> torch.Tensor:
    """Replace one contiguous span of each sentence by [MASK] (Mirror-BERT's input view).

    input_ids, attention_mask, special_tokens_mask: [b, t] (CPU tensors). The span length is
    drawn from a geometric distribution with success probability ``p`` and capped at ``cap``;
    a sentence with fewer maskable tokens gets a shorter span. [CLS], [SEP] and padding are
    never masked. Returns new ids; the input is not changed."""
    out = input_ids.clone()
    maskable = attention_mask.bool() & ~special_tokens_mask.bool()
    lengths = sample_span_lengths(input_ids.shape[0], p, cap, generator)
    for i in range(input_ids.shape[0]):
        positions = maskable[i].nonzero().flatten()  # contiguous for BERT inputs: [CLS] w1..wn [SEP]
        span = min(int(lengths[i]), len(positions))
        if span == 0:
            continue
        start = int(torch.randint(0, len(positions) - span + 1, (1,), generator=generator))
        out[i, positions[start:start + span]] = mask_token_id
    return out


#: The candidates of each anchor (``--negatives``): the report's 2b - 1 one-sided; SimCSE's b
#: (``cl_forward``: each z1_i against the z2_j only); Mirror-BERT's NT-Xent, symmetric over the 2b views.
NEGATIVES = ("report", "simcse", "ntxent")


def char_span_mask(text: str, chars: int = 5, mask_token: str = "[MASK]", generator=None,
                   min_length: int = 30) -> str:
    """Mirror-BERT's released view of a sentence: ``chars`` consecutive characters of the raw text,
    at a uniform position, replaced by the mask token (spaced, so it stays one token). Sentences
    shorter than ``min_length`` characters are left as they are, as in Mirror-BERT's data loader."""
    if len(text) < max(min_length, chars + 1):
        return text
    start = int(torch.randint(0, len(text) - chars, (1,), generator=generator))
    return f"{text[:start]} {mask_token} {text[start + chars:]}"


class InfoNCE(nn.Module):
    """InfoNCE with cosine similarity and temperature (Mirror-BERT / SimCSE, unsupervised).

    Inputs: ``anchors`` f(x) and ``positives`` f'(x'), both [b, D], row i a positive pair; returns
    the mean cross-entropy (a scalar, float32) of the softmax over each anchor's candidates,
    cosine / ``temperature``. ``negatives`` chooses the candidates:

    - ``report`` (the BERT-CF report, section 3): for anchor i every positive f'(x'_j) (j = i is
      the target) and every other anchor f(x_j), j != i: 2b - 1 candidates, mean over the b anchors;
    - ``simcse`` (SimCSE's published loss): the b positives only;
    - ``ntxent`` (Mirror-BERT's published loss, SimCLR's NT-Xent): each of the 2b views is an anchor
      whose candidates are the other 2b - 1 views (its pair the target), mean over the 2b anchors.

    ``hard_negatives`` [b, D] (supervised SimCSE: each premise's contradiction), when given, adds
    every hard negative of the batch to every anchor's candidates (b more columns; ``report`` and
    ``simcse``; NT-Xent, a loss over two views of one sentence, has no place for them).

    Under torch.distributed the candidates come from the global batch of every rank
    (``gather=True``), the anchors stay local.
    """

    def __init__(self, temperature: float = 0.05, gather: bool = True, negatives: str = "report"):
        super().__init__()
        if negatives not in NEGATIVES:
            raise ValueError(f"negatives must be one of {NEGATIVES}, not {negatives!r}")
        self.temperature = temperature
        self.gather = gather
        self.negatives = negatives

    def logits_and_targets(self, anchors, positives, hard_negatives=None):
        """(scores of each anchor against its candidates [rows, candidates], self masked with -inf;
        [rows] the column of each anchor's target). report: [b, 2B] = [all positives | all
        anchors]; simcse: [b, B]; ntxent: [2b, 2B], rows the local anchors then the local
        positives, columns [all anchors | all positives]. With ``hard_negatives``, B more columns
        at the end: [... | all hard negatives]."""
        if hard_negatives is not None and self.negatives == "ntxent":
            raise ValueError("ntxent (two views of one sentence) takes no hard negatives")
        views = [F.normalize(x.float(), dim=-1) for x in (anchors, positives, hard_negatives) if x is not None]
        a, p, h = views[0], views[1], views[2] if len(views) == 3 else None
        all_a, all_p, all_h, offset = a, p, h, 0
        if self.gather:
            # One collective for all: [b, 2 or 3, D] -> [B, 2 or 3, D].
            gathered = gather_with_grad(torch.stack(views, dim=1))
            if gathered.shape[0] != a.shape[0]:
                all_a, all_p = gathered[:, 0], gathered[:, 1]
                all_h = gathered[:, 2] if h is not None else None
                offset = dist_info()[0] * a.shape[0]
        b, total = a.shape[0], all_a.shape[0]
        rows = torch.arange(b, device=a.device)
        # float32 even under autocast: bf16 cosines (3 digits) divided by tau = 0.05 are off by ~0.05.
        with torch.autocast(device_type=a.device.type, enabled=False):
            hard = [a @ all_h.T] if h is not None else []
            if self.negatives == "simcse":
                return torch.cat([a @ all_p.T] + hard, dim=1) / self.temperature, rows + offset
            if self.negatives == "report":
                to_positives, to_anchors = a @ all_p.T, a @ all_a.T
                to_anchors[rows, rows + offset] = float("-inf")  # an anchor is not its own candidate
                return torch.cat([to_positives, to_anchors] + hard, dim=1) / self.temperature, rows + offset
            views, candidates = torch.cat([a, p]), torch.cat([all_a, all_p])
            scores = views @ candidates.T
        own = torch.cat([rows + offset, rows + offset + total])  # each view's own column
        scores[torch.arange(2 * b, device=a.device), own] = float("-inf")
        pair = torch.cat([rows + offset + total, rows + offset])  # its pair: x_i <-> x'_i
        return scores / self.temperature, pair

    def forward(self, anchors, positives, hard_negatives=None):
        logits, targets = self.logits_and_targets(anchors, positives, hard_negatives)
        return F.cross_entropy(logits, targets)
