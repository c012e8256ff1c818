"""The objectives' settings, one frozen dataclass per family, each field with its default (the
report's, where the report sets it), its help and its check. An objective names the families it
takes (``Objective.SETTINGS``) and is built from keyword arguments of their fields
(``objectives.Mirror(encoder, temperature=0.05)``); ``run_pretrain.py`` declares a flag for every
field (``bertcf.config.pretrain``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..cli import AT_LEAST_0, AT_LEAST_1, POSITIVE, PROBABILITY, checked, comma_list
from ..errors import UsageError
from ..models.flow import FLOW_LOSS_UNITS, PERMUTATIONS
from ..settings import Settings, option
from .contrastive import NEGATIVES

CONTRASTIVE = "contrastive (mirror, simcse, joint, bsl)"
SUPERVISED = "supervised (--stage supervised)"
FLOW = "flow (--stage joint and flow)"
OTHERS = "bsl, ct, tsdae, mlm (--stage mirror)"
SPAN_UNITS = ("token", "char")


@dataclass(frozen=True)
class SpanSettings(Settings):
    """The masked span of Mirror-BERT's second view (and BSL's)."""

    GROUP = CONTRASTIVE
    span_p: float = option(0.3, "geometric success probability of the span length",
                           type=checked(float, lambda v: 0 < v <= 1, "in (0, 1]"))
    span_cap: int = option(5, "longest masked span (simcse: 0)", type=AT_LEAST_0)
    span_unit: str = option("token", "token: a span of tokens ~ Geometric(--span-p) capped at --span-cap (the "
                                     "report); char: --span-chars characters of the raw text, in sentences of 30 "
                                     "characters or more (Mirror-BERT's released code)", choices=SPAN_UNITS)
    span_chars: int = option(5, "--span-unit char: characters replaced by [MASK]", type=AT_LEAST_1)


@dataclass(frozen=True)
class InfoNCESettings(Settings):
    """InfoNCE's temperature and candidates (``contrastive.InfoNCE``)."""

    GROUP = CONTRASTIVE
    temperature: float = option(0.05, "InfoNCE's temperature (cosines are divided by it)", type=POSITIVE)
    negatives: str = option("report", "each anchor's candidates: report, the report's 2b - 1 (one-sided); simcse, "
                                      "SimCSE's b (the positives only); ntxent, Mirror-BERT's NT-Xent over the 2b "
                                      "views (symmetric)", choices=NEGATIVES)


@dataclass(frozen=True)
class FlowSettings(Settings):
    """The Glow flow learned on the encoder's vectors, and the unit of its loss."""

    GROUP = FLOW
    flow_blocks: int = option(3, "Glow blocks (ActNorm, --flow-permutation, additive coupling)", type=AT_LEAST_1)
    flow_hidden: int | None = option(None, "coupling network width (default: D)", type=AT_LEAST_1)
    flow_permutation: str = option("lu", "the map between couplings: lu, Glow's learned invertible 1x1 (the report's "
                                         "text), or reverse, the fixed reversal of the BERT-flow implementation the "
                                         "report cites", choices=tuple(PERMUTATIONS))
    flow_loss_unit: str = option("bits-per-dim", "unit of L_flow in the loss: bits-per-dim, NLL / (D ln 2), as in "
                                                 "the BERT-flow implementations the report uses, or nats, the NLL "
                                                 "summed over D", choices=FLOW_LOSS_UNITS)


@dataclass(frozen=True)
class JointLossSettings(Settings):
    """BERT-CF's joint loss: the weight of its contrastive term, and whether it trains the encoder."""

    GROUP = FLOW
    lambda_mirror: float = option(0.3, "weight of L_mirror in the joint loss", type=float)
    unfreeze_encoder: bool = option(False, "joint: train the encoder by L_mirror too", switch=True)
    encoder_lr: float = option(1e-4, "joint --unfreeze-encoder: the encoder's learning rate, the mirror stage's; "
                                     "the flow keeps --lr", type=POSITIVE)


@dataclass(frozen=True)
class BSLSettings(Settings):
    GROUP = OTHERS
    momentum: float = option(0.999, "bsl: EMA momentum of the target encoder", type=PROBABILITY)
    predictor_k: int = option(8, "bsl: the predictor's hidden width is k * D, as in the BSL paper", type=AT_LEAST_1)
    predictor_hidden: int | None = option(None, "bsl: the predictor's hidden width, overriding --predictor-k",
                                          type=AT_LEAST_1)


@dataclass(frozen=True)
class CTSettings(Settings):
    GROUP = OTHERS
    ct_negatives: int = option(7, "ct: negative pairs per positive pair (7: 1 positive pair in 8)", type=AT_LEAST_1)


@dataclass(frozen=True)
class TSDAESettings(Settings):
    GROUP = OTHERS
    deletion_ratio: float = option(0.6, "tsdae: probability of deleting each token", type=PROBABILITY)


@dataclass(frozen=True)
class MLMSettings(Settings):
    GROUP = OTHERS
    mlm_probability: float = option(0.15, "mlm: share of tokens to predict",
                                    type=checked(float, lambda v: 0 < v < 1, "in (0, 1)"))


@dataclass(frozen=True)
class MemorySettings(Settings):
    """--mini-batch-size: the gradient cache (``objectives.cache``), for the objectives that allow it."""

    GROUP = "memory"
    mini_batch_size: int | None = option(
        None, "embed the batch M rows at a time and cache the loss's gradient on the sentence vectors (GradCache): "
              "the encoder holds M rows' activations whatever --batch-size, the update is the whole batch's, and a "
              "step costs one more forward pass of the encoder", type=AT_LEAST_1, metavar="M")


@dataclass(frozen=True)
class CoSENTSettings(Settings):
    """CoSENT's and AnglE's ranking of the batch's pairs."""

    GROUP = SUPERVISED
    scale: float = option(20.0, "cosent, angle: the scale of the score differences, an inverse temperature "
                                "(sentence-transformers' 20)", type=POSITIVE)


#: MarginMSE's score of a (query, passage) pair: sentence-transformers' pairwise_dot_score (its default) or pairwise_cos_sim.
MARGIN_SCORES = ("dot", "cos")


@dataclass(frozen=True)
class MarginMSESettings(Settings):
    """MarginMSE's score (``objectives.margin_mse``)."""

    GROUP = SUPERVISED
    margin_score: str = option("dot", "margin-mse: the bi-encoder's score of a (query, passage) pair whose margins are "
                                      "fitted: dot, the dot product (as sentence-transformers' MarginMSELoss and GPL "
                                      "score), or cos, the cosine", choices=MARGIN_SCORES)


WIDTHS = comma_list(int, lambda v: all(d >= 1 for d in v) and len(set(v)) == len(v),
                    "comma-separated distinct widths of at least 1, e.g. 384,256,128,64")
WEIGHTS = comma_list(float, lambda v: all(w >= 0 for w in v), "comma-separated weights >= 0, e.g. 1,1,1,1")


@dataclass(frozen=True)
class MatryoshkaSettings(Settings):
    """Matryoshka representation learning (Kusupati et al. 2022): the loss at several widths."""

    GROUP = "matryoshka (mirror, simcse, simcse-sup, sbert-cosine, cosent, angle, distill)"
    matryoshka_dims: tuple[int, ...] | None = option(
        None, "train at several nested widths at once: the loss summed over the widths, each on the vectors' first k "
              "dimensions, L2-normalised (as sentence-transformers' MatryoshkaLoss), e.g. 384,256,128,64", type=WIDTHS)
    matryoshka_weights: tuple[float, ...] | None = option(
        None, "the weight of each width's loss, in the order of --matryoshka-dims (default: 1 each)", type=WEIGHTS)

    def __post_init__(self):
        super().__post_init__()
        if self.matryoshka_weights is not None and len(self.matryoshka_weights) != len(self.matryoshka_dims or ()):
            raise UsageError(f"--matryoshka-weights gives {len(self.matryoshka_weights)} weights for "
                             f"{len(self.matryoshka_dims or ())} --matryoshka-dims")
