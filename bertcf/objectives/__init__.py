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
from .mirror import SIMCSE_VIEWS, Mirror, SimCSE
from .mixture import Mixture
from .mlm import MaskedLM
from .sbert_cosine import SBERTCosine
from .sbert_softmax import SBERTSoftmax
from .simcse_sup import SupervisedSimCSE
from .settings import (
    BSLSettings,
    CoSENTSettings,
    CTSettings,
    FlowSettings,
    InfoNCESettings,
    JointLossSettings,
    MarginMSESettings,
    MatryoshkaSettings,
    MLMSettings,
    SpanSettings,
    TSDAESettings,
)
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


#: The families of settings that objectives take (``Objective.SETTINGS``); --mini-batch-size's
#: ``MemorySettings`` is the run's, which an objective allows or not (``Objective.mini_batches``).
FAMILIES = (SpanSettings, InfoNCESettings, FlowSettings, JointLossSettings, BSLSettings, CTSettings, TSDAESettings,
            MLMSettings, CoSENTSettings, MarginMSESettings, MatryoshkaSettings)


def objective_class(stage: str, method: str) -> type[Objective]:
    """The class of ``--stage``/``--method`` (``METHODS``)."""
    return {"joint": Joint, "flow": FlowOnly}.get(stage) or (SUPERVISED if stage == "supervised" else OBJECTIVES)[method]


def methods_taking(family) -> list[str]:
    """The methods whose objective takes the settings ``family``, by --method (--stage joint and
    flow by their stage), in ``METHODS``' order."""
    found = []
    for stage, methods in METHODS.items():
        for method in methods:
            name = method if stage in ("mirror", "supervised") else f"--stage {stage}"
            if family in objective_class(stage, method).SETTINGS and name not in found:
                found.append(name)
    return found


__all__ = ["OBJECTIVES", "SUPERVISED", "METHODS", "MINI_BATCH_METHODS", "FAMILIES", "SIMCSE_VIEWS", "Examples",
           "Objective", "objective_class", "methods_taking",
           "Mirror", "SimCSE", "Joint", "FlowOnly", "BSL", "ContrastiveTension", "TSDAE", "MaskedLM", "SBERTSoftmax",
           "SBERTCosine", "SupervisedSimCSE", "Distill", "CoSENT", "AnglE", "MarginMSE", "Mixture"]
