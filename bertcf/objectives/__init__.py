"""The pretraining objectives behind ``run_pretrain.py --method``, one module each, all of one
shape (``base.Objective``): built from the encoder, its settings and a seeded generator;
``objective(ids, mask, special, rank, world) -> (loss, scalars)`` on a batch of the corpus; its
extra modules (predictor, EMA target, second encoder, decoder, MLM head, flow) and what of them
a checkpoint keeps. Pretraining (``bertcf.pretrain``) builds one and hands it to the
Trainer; the bench times the same objects.

  --stage mirror:      mirror (Mirror-BERT), simcse, bsl, ct, tsdae, mlm
  --stage joint:       joint (BERT-CF; --method simcse gives SimCSE-joint)
  --stage flow:        flow (the flow alone: MinBERT-flow, Mirror-flow)
  --stage supervised:  sbert-softmax, sbert-cosine (Sentence-BERT), simcse-sup (supervised SimCSE),
                       distill (knowledge distillation); each reads its own examples
                       (``read_examples``: labelled pairs or triples from --train-file, or the
                       corpus with a teacher's vectors) instead of the corpus alone

``add_args`` and ``check_args`` hold the objectives' flags.
"""
from __future__ import annotations

from ..cli import AT_LEAST_0, AT_LEAST_1, POSITIVE, PROBABILITY, checked
from ..errors import UsageError
from ..models.flow import FLOW_LOSS_UNITS, PERMUTATIONS
from .base import DEFAULTS, Examples, Objective
from .bsl import BSL
from .contrastive import NEGATIVES
from .ct import ContrastiveTension
from .distill import Distill
from .joint import FlowOnly, Joint
from .mirror import Mirror, SimCSE
from .mlm import MaskedLM
from .sbert_cosine import SBERTCosine
from .sbert_softmax import SBERTSoftmax
from .simcse_sup import SupervisedSimCSE
from .tsdae import TSDAE

#: ``--method`` of ``--stage mirror`` -> its objective.
OBJECTIVES = {"mirror": Mirror, "simcse": SimCSE, "bsl": BSL, "ct": ContrastiveTension, "tsdae": TSDAE,
              "mlm": MaskedLM}
#: ``--method`` of ``--stage supervised`` -> its objective (``supervised.Supervised``).
SUPERVISED = {"sbert-softmax": SBERTSoftmax, "sbert-cosine": SBERTCosine, "simcse-sup": SupervisedSimCSE,
              "distill": Distill}
#: Each stage's methods; the first is its default.
METHODS = {"mirror": tuple(OBJECTIVES), "joint": ("mirror", "simcse"), "flow": ("flow",),
           "supervised": tuple(SUPERVISED)}
#: What --mini-batch-size applies to (``Objective.mini_batches``), in words.
MINI_BATCH_METHODS = ", ".join([m for m, cls in (OBJECTIVES | SUPERVISED).items() if cls.mini_batches]
                               + ["--stage joint, flow"])


def objective_class(stage: str, method: str) -> type[Objective]:
    """The class of ``--stage``/``--method`` (``METHODS``)."""
    return {"joint": Joint, "flow": FlowOnly}.get(stage) or (SUPERVISED if stage == "supervised" else OBJECTIVES)[method]


def build_objective(stage: str, method: str, encoder, args=None, generator=None,
                    examples: Examples | None = None) -> Objective:
    """The objective of ``--stage``/``--method`` (``METHODS``) on ``encoder``. The joint stage's
    method picks its contrastive term: simcse's view has no span (``args.span_cap`` 0). A
    supervised objective is built with the examples it trains on (``read_examples``)."""
    cls = objective_class(stage, method)
    return cls(encoder, args, generator, examples) if stage == "supervised" else cls(encoder, args, generator)


def reads_corpus(args) -> bool:
    """Whether the run of ``args`` reads the pretraining corpus: every method but the supervised ones
    that train on --train-file."""
    return args.stage != "supervised" or SUPERVISED[args.method].reads_corpus(args)


def read_examples(args, corpus) -> Examples:
    """What the run of ``args`` trains on: a supervised method's examples (from --train-file, or
    the corpus with a teacher's vectors), or the corpus, ``corpus()``: one column of sentences."""
    if args.stage == "supervised":
        return SUPERVISED[args.method].read_examples(args, corpus)
    sentences = corpus()
    return Examples([sentences], what=f"{len(sentences):,} corpus sentences")


def add_args(parser) -> None:
    """The objectives' flags, one argument group per family."""
    g = parser.add_argument_group("contrastive (mirror, simcse, joint, bsl)")
    g.add_argument("--span-p", type=checked(float, lambda v: 0 < v <= 1, "in (0, 1]"), default=DEFAULTS["span_p"],
                   help="geometric success probability of the span length")
    g.add_argument("--span-cap", type=AT_LEAST_0, default=DEFAULTS["span_cap"], help="longest masked span (simcse: 0)")
    g.add_argument("--temperature", type=POSITIVE, default=DEFAULTS["temperature"],
                   help="InfoNCE's temperature (cosines are divided by it)")
    g.add_argument("--negatives", choices=NEGATIVES, default=DEFAULTS["negatives"],
                   help="each anchor's candidates: report, the report's 2b - 1 (one-sided); simcse, SimCSE's b "
                        "(the positives only); ntxent, Mirror-BERT's NT-Xent over the 2b views (symmetric)")
    g.add_argument("--span-unit", choices=("token", "char"), default=DEFAULTS["span_unit"],
                   help="token: a span of tokens ~ Geometric(--span-p) capped at --span-cap (the report); char: "
                        "--span-chars characters of the raw text, in sentences of 30 characters or more "
                        "(Mirror-BERT's released code)")
    g.add_argument("--span-chars", type=AT_LEAST_1, default=DEFAULTS["span_chars"],
                   help="--span-unit char: characters replaced by [MASK]")
    g = parser.add_argument_group(f"memory ({MINI_BATCH_METHODS})")
    g.add_argument("--mini-batch-size", type=AT_LEAST_1, default=DEFAULTS["mini_batch_size"], metavar="M",
                   help="embed the batch M rows at a time and cache the loss's gradient on the sentence vectors "
                        "(GradCache): the encoder holds M rows' activations whatever --batch-size, the update is "
                        "the whole batch's, and a step costs one more forward pass of the encoder")
    g = parser.add_argument_group("supervised (--stage supervised)")
    g.add_argument("--train-file", nargs="+", metavar="FILE", default=None,
                   help="labelled training files, of one kind: NLI (SNLI/MultiNLI .jsonl or .txt, or a premise<TAB>"
                        "hypothesis<TAB>label TSV) for sbert-softmax and simcse-sup, a CS224N STS or QQP file for "
                        "sbert-cosine (default DATA_DIR/sts-train.csv) and sbert-softmax (QQP); distill: "
                        "source<TAB>target lines or one sentence a line (default: the corpus)")
    g.add_argument("--teacher", default=None, metavar="DIR|NAME",
                   help="distill: the teacher encoder (a checkpoint, run directory, sentence-transformers "
                        "directory or Hugging Face name), whose vectors of the training sentences the student learns")
    g.add_argument("--teacher-cache", default=None, metavar="DIR",
                   help="distill: where the teacher's vectors are kept, one file per teacher and corpus "
                        "(default: OUT_DIR/teacher); runs that share it compute them once")
    g = parser.add_argument_group("flow (--stage joint and flow)")
    g.add_argument("--lambda-mirror", type=float, default=DEFAULTS["lambda_mirror"],
                   help="weight of L_mirror in the joint loss")
    g.add_argument("--flow-blocks", type=AT_LEAST_1, default=DEFAULTS["flow_blocks"],
                   help="Glow blocks (ActNorm, --flow-permutation, additive coupling)")
    g.add_argument("--flow-hidden", type=AT_LEAST_1, default=None, help="coupling network width (default: D)")
    g.add_argument("--flow-permutation", choices=tuple(PERMUTATIONS), default=DEFAULTS["flow_permutation"],
                   help="the map between couplings: lu, Glow's learned invertible 1x1 (the report's text), or "
                        "reverse, the fixed reversal of the BERT-flow implementation the report cites")
    g.add_argument("--flow-loss-unit", choices=FLOW_LOSS_UNITS, default=DEFAULTS["flow_loss_unit"],
                   help="unit of L_flow in the loss: bits-per-dim, NLL / (D ln 2), as in the BERT-flow "
                        "implementations the report uses, or nats, the NLL summed over D")
    g.add_argument("--unfreeze-encoder", action="store_true", help="joint: train the encoder by L_mirror too")
    g.add_argument("--encoder-lr", type=POSITIVE, default=DEFAULTS["encoder_lr"],
                   help="joint --unfreeze-encoder: the encoder's learning rate, the mirror stage's; the flow "
                        "keeps --lr")
    g = parser.add_argument_group("bsl, ct, tsdae, mlm (--stage mirror)")
    g.add_argument("--momentum", type=PROBABILITY, default=DEFAULTS["momentum"],
                   help="bsl: EMA momentum of the target encoder")
    g.add_argument("--predictor-k", type=AT_LEAST_1, default=DEFAULTS["predictor_k"],
                   help="bsl: the predictor's hidden width is k * D, as in the BSL paper")
    g.add_argument("--predictor-hidden", type=AT_LEAST_1, default=None,
                   help="bsl: the predictor's hidden width, overriding --predictor-k")
    g.add_argument("--ct-negatives", type=AT_LEAST_1, default=DEFAULTS["ct_negatives"],
                   help="ct: negative pairs per positive pair (7: 1 positive pair in 8)")
    g.add_argument("--deletion-ratio", type=PROBABILITY, default=DEFAULTS["deletion_ratio"],
                   help="tsdae: probability of deleting each token")
    g.add_argument("--mlm-probability", type=checked(float, lambda v: 0 < v < 1, "in (0, 1)"),
                   default=DEFAULTS["mlm_probability"],
                   help="mlm: share of tokens to predict")


def check_args(args) -> None:
    """What the flags' own types cannot check (a bad value is a UsageError)."""
    if args.stage != "joint" and args.unfreeze_encoder:
        raise UsageError("--unfreeze-encoder is for --stage joint")
    if getattr(args, "mini_batch_size", None) and not objective_class(args.stage, args.method).mini_batches:
        raise UsageError(f"--mini-batch-size is for the objectives that compare a batch's sentence vectors "
                         f"({MINI_BATCH_METHODS}); --method {args.method}'s loss is a sum over each sentence's "
                         f"tokens, whose memory a cache of sentence vectors would not bound")
    if args.pooling == "cls-mlp" and (args.stage, args.method) not in (("mirror", "mirror"), ("mirror", "simcse"),
                                                                       ("supervised", "simcse-sup")):
        raise UsageError("--pooling cls-mlp (SimCSE's training head) is for --stage mirror --method mirror|simcse and "
                         "--stage supervised --method simcse-sup")
    check_supervised_args(args)


def check_supervised_args(args) -> None:
    """The supervised group's flags belong to their methods."""
    method = args.method if args.stage == "supervised" else None
    if getattr(args, "train_file", None) and method is None:
        raise UsageError("--train-file is for --stage supervised (its methods read labelled files)")
    if method in ("sbert-softmax", "simcse-sup") and not args.train_file:
        raise UsageError(f"--method {method} needs --train-file FILE [FILE ...] (NLI: SNLI/MultiNLI .jsonl or "
                         f".txt, or a premise<TAB>hypothesis<TAB>label TSV" + (", or a CS224N QQP file)"
                                                                                 if method == "sbert-softmax" else ")"))
    if method == "distill" and not args.teacher:
        raise UsageError("--method distill needs --teacher DIR|NAME (the encoder to distil)")
    if method != "distill" and (getattr(args, "teacher", None) or getattr(args, "teacher_cache", None)):
        raise UsageError("--teacher and --teacher-cache are for --stage supervised --method distill")
    if method == "simcse-sup" and args.negatives == "ntxent":
        raise UsageError("--negatives ntxent (two views of one sentence) does not apply to simcse-sup: "
                         "choose report or simcse")


__all__ = ["OBJECTIVES", "SUPERVISED", "METHODS", "Examples", "Objective", "build_objective", "objective_class",
           "read_examples", "reads_corpus", "add_args", "check_args", "Mirror", "SimCSE", "Joint", "FlowOnly", "BSL", "ContrastiveTension", "TSDAE",
           "MaskedLM", "SBERTSoftmax", "SBERTCosine", "SupervisedSimCSE", "Distill"]
