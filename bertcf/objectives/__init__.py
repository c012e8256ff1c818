"""The pretraining objectives behind ``run_pretrain.py --method``, one module each, all of one
shape (``base.Objective``): built from the encoder and keyword settings (the families of
``objectives.settings``, e.g. ``Mirror(encoder, temperature=0.05)``);
``objective(ids, mask, special, rank, world) -> (loss, scalars)`` on a batch of the corpus; its
extra modules (predictor, EMA target, second encoder, decoder, MLM head, flow) and what of them
a checkpoint keeps. ``bertcf.Trainer`` trains one; the bench times the same objects.

  --stage mirror:      mirror (Mirror-BERT), simcse, bsl, ct, tsdae, mlm
  --stage joint:       joint (BERT-CF; --method simcse gives SimCSE-joint: span_cap 0)
  --stage flow:        flow (the flow alone: MinBERT-flow, Mirror-flow)
  --stage supervised:  sbert-softmax, sbert-cosine (Sentence-BERT), simcse-sup (supervised SimCSE;
                       MNRL on (query, positive) pairs), distill (knowledge distillation), cosent, angle,
                       margin-mse (a cross-encoder's margins, GPL); each reads its own examples
                       (``read_examples``: labelled pairs or triples from --train-file, or the
                       corpus with a teacher's vectors) instead of the corpus alone
"""
from __future__ import annotations

from ..data.examples import Examples
from .base import Objective
from .bsl import BSL
from .cosent import AnglE, CoSENT
from .ct import ContrastiveTension
from .distill import Distill
from .joint import FlowOnly, Joint
from .margin_mse import MarginMSE
from .mirror import Mirror, SimCSE
from .mixture import Mixture
from .mlm import MaskedLM
from .sbert_cosine import SBERTCosine
from .sbert_softmax import SBERTSoftmax
from .simcse_sup import SupervisedSimCSE
from .settings import MatryoshkaSettings
from .tsdae import TSDAE

#: ``--method`` of ``--stage mirror`` -> its objective.
OBJECTIVES = {"mirror": Mirror, "simcse": SimCSE, "bsl": BSL, "ct": ContrastiveTension, "tsdae": TSDAE,
              "mlm": MaskedLM}
#: ``--method`` of ``--stage supervised`` -> its objective (``supervised.Supervised``).
SUPERVISED = {"sbert-softmax": SBERTSoftmax, "sbert-cosine": SBERTCosine, "simcse-sup": SupervisedSimCSE,
              "distill": Distill, "cosent": CoSENT, "angle": AnglE, "margin-mse": MarginMSE}
#: Each stage's methods; the first is its default.
METHODS = {"mirror": tuple(OBJECTIVES), "joint": ("mirror", "simcse"), "flow": ("flow",),
           "supervised": tuple(SUPERVISED)}
#: What --mini-batch-size applies to (``Objective.mini_batches``), in words.
MINI_BATCH_METHODS = ", ".join([m for m, cls in (OBJECTIVES | SUPERVISED).items() if cls.mini_batches]
                               + ["--stage joint, flow"])
#: What --matryoshka-dims applies to (``MatryoshkaSettings`` among an objective's settings), in words.
MATRYOSHKA_METHODS = ", ".join(m for m, cls in (OBJECTIVES | SUPERVISED).items() if MatryoshkaSettings in cls.SETTINGS)


def objective_class(stage: str, method: str) -> type[Objective]:
    """The class of ``--stage``/``--method`` (``METHODS``)."""
    return {"joint": Joint, "flow": FlowOnly}.get(stage) or (SUPERVISED if stage == "supervised" else OBJECTIVES)[method]


__all__ = ["OBJECTIVES", "SUPERVISED", "METHODS", "MINI_BATCH_METHODS", "Examples", "Objective", "objective_class",
           "Mirror", "SimCSE", "Joint", "FlowOnly", "BSL", "ContrastiveTension", "TSDAE", "MaskedLM", "SBERTSoftmax",
           "SBERTCosine", "SupervisedSimCSE", "Distill", "CoSENT", "AnglE", "MarginMSE", "Mixture"]
