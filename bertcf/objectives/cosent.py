"""CoSENT and AnglE: scored pairs ranked against each other in the batch, by cosine or by angle."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .settings import CoSENTSettings, MatryoshkaSettings
from .supervised import ScoredPairs


def ranking_loss(scores: torch.Tensor, gold: torch.Tensor, scale: float) -> torch.Tensor:
    """CoSENT's loss of ``scores`` [b] against ``gold`` [b]: every ordered pair of examples (i, j)
    with gold_i > gold_j whose scores disagree is penalised,

        loss = log(1 + sum over {(i, j): gold_i > gold_j} of exp(scale * (s_j - s_i))),

    computed as a logsumexp over the b x b differences with a 0 for the 1 (a batch without two
    distinct scores gives log 1 = 0)."""
    s = scale * scores.float()
    differences = s[None, :] - s[:, None]  # [i, j] = s_j - s_i
    ranked = gold[:, None] > gold[None, :]
    return torch.logsumexp(torch.cat([s.new_zeros(1), differences[ranked]]), dim=0)


def angle_similarity(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """AnglE's similarity [b] of the rows of ``u`` and ``v`` [b, D]: each vector read as D/2 complex
    numbers (first half real, second half imaginary; an odd D padded with a zero), and the sum of
    the real and imaginary parts of their normalised inner product <u, v> = sum_k u_k conj(v_k) /
    (|u| |v|), in absolute value (Li & Li 2024, "AnglE-optimized Text Embeddings", ACL, section 3.3)."""
    u, v = u.float(), v.float()
    if u.shape[-1] % 2:
        u, v = F.pad(u, (0, 1)), F.pad(v, (0, 1))
    zu = torch.complex(*u.chunk(2, dim=-1))
    zv = torch.complex(*v.chunk(2, dim=-1))
    inner = (zu * zv.conj()).sum(-1) / (u.norm(dim=-1) * v.norm(dim=-1))
    return (inner.real + inner.imag).abs()


class CoSENT(ScoredPairs):
    """CoSENT (Huang et al. 2024, "CoSENT: Consistent Sentence Embedding via Similarity Ranking",
    IEEE/ACM TASLP; Su 2022): the cosines of the batch's pairs ranked as their gold scores are.

    Inputs: pairs (s1, s2) with a gold similarity y [b] (STS: score / 5; QQP: 1 or 0; only the
    order matters). With u = f(s1), v = f(s2) [b, D] and s = cos(u, v) [b]:

        loss = log(1 + sum over {(i, j): y_i > y_j} of exp(scale * (s_j - s_i))),  scale 20.

    Settings: ``CoSENTSettings`` (``scale``), ``MatryoshkaSettings``. The data: ``ScoredPairs``'s (the
    CS224N STS training file by default), as SBERT's regression (``SBERTCosine``)."""

    SETTINGS = (CoSENTSettings, MatryoshkaSettings)

    @staticmethod
    def similarity(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(u.float(), v.float())

    def pair_loss(self, u: torch.Tensor, v: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        """The loss of vectors u, v [b, d] (one width) against the gold similarities [b]."""
        return ranking_loss(self.similarity(u, v), gold, self.settings.scale)

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        u, v, y = self.pair_vectors(ids, mask, rank, world, labels)
        loss = self.at_widths(lambda w, gold: self.pair_loss(*w, gold), [u, v], y)
        with torch.no_grad():
            scalars = {"pair_similarity": self.similarity(u, v).mean(), "gold": y.mean()}
        return loss, scalars


class AnglE(CoSENT):
    """AnglE (Li & Li 2024, "AnglE-optimized Text Embeddings", ACL): CoSENT's ranking loss with the
    angle similarity in complex space (``angle_similarity``) in place of the cosine, which keeps a
    gradient where the cosine saturates. Inputs, settings and default data as ``CoSENT``. (The
    paper adds the cosine and in-batch negative objectives to this one; sentence-transformers'
    AnglELoss, as here, is the angle objective alone.)"""

    similarity = staticmethod(angle_similarity)
