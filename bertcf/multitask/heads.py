"""Stage 3's task heads: everything that depends on a task's kind, in one class per kind and pair
encoding (as MT-DNN registers a class per task type, and as sentence-transformers' losses own
their classifier). A head owns its layers, its forward from what the encoder gives it, its loss,
its predictions, its scores for precision-recall curves, the view of its outputs that SMART
perturbs, and whether its pairs are read jointly. The rest of the package asks the head; it does
not branch on a kind.

The heads (:data:`HEADS`, by registry name; :func:`head_type` picks one) are the classes below, each
with its equations and paper. A new kind is one class here (its ``serves`` says which declarations
it takes) and its entries in ``tasks`` (KINDS, LOSSES, METRICS).

Each head is registered in its model as ``{task}_head``, its dropout and linear layer as children
"0" and "1" (``sst_head.1.weight``, the keys of the nn.Sequential the heads were: every checkpoint
since the report loads). D: the encoder's output width (after its flow and linear head); H: BERT's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..errors import UsageError
from ..models.encoder import FIRST_LAST_AVG, pool
from .losses import (ClassificationLoss, CosineRegressionLoss, HingeCosineLoss, MultipleNegativesRankingLoss,
                     PairLogitLoss, PairScoreLoss, clamped_cosine, cosine_matrix)
from .smart import binary_sym_kl_loss, squared_error_loss, sym_kl_loss
from .tasks import Task


@dataclass(frozen=True)
class Widths:
    """What a head's layer may read: the encoder's sentence vector (D), BERT's pooled [CLS] (H), --proj-dim."""
    sentence: int
    hidden: int
    proj: int


#: Registry name -> head class (:func:`register`).
HEADS: dict[str, type["TaskHead"]] = {}


def register(cls: type["TaskHead"]) -> type["TaskHead"]:  # a class decorator: a head known by its name
    HEADS[cls.name] = cls
    return cls


def head_type(task: Task, pair_encoding: str = "bi") -> type["TaskHead"]:
    """The head class that serves ``task`` when pairs are encoded as ``pair_encoding``."""
    found = [cls for cls in HEADS.values() if cls.serves(task, pair_encoding)]
    if not found:  # a declaration the heads cannot read this way (a pair-ranking task read jointly)
        raise UsageError(f"task {task.name!r}: no head reads a {task.kind} task (loss {task.loss}) with "
                         f"--pair-encoding {pair_encoding}")
    if len(found) > 1:
        raise ValueError(f"task {task.name!r}: several heads serve it ({', '.join(c.name for c in found)})")
    return found[0]


def build_head(task: Task, widths: Widths, pair_encoding: str = "bi") -> "TaskHead":
    return head_type(task, pair_encoding)(task, widths)


class TaskHead(nn.Module):
    """A task's head on the shared encoder: dropout + one linear layer, and what the task does with
    its output and labels. Subclasses set the class attributes and the methods below.

    ``rows_per_example``: rows an example takes in the step's batch of sentences (2 for a pair
    encoded apart); ``joint``: its pairs are tokenised together and read through BERT's pooled
    [CLS] (:meth:`forward_joint`); ``projector`` / ``pr_curve``: what TensorBoard shows of it at the
    best checkpoint (its dev sentences labelled by class / a precision-recall curve per class)."""

    name = ""
    rows_per_example = 1
    joint = False
    projector = False
    pr_curve = False
    label_dtype = torch.long  # its labels: class indices (long), or scores (float32)
    uses = frozenset()  # what it reads beyond its layer: --proj-dim ("proj_dim"), its task's margin h ("margin")

    def __init__(self, task: Task, width: int, out: int):
        super().__init__()
        self.task = task
        # Children "0" and "1" as the nn.Sequential each head was (its checkpoints' keys), in its order (same draws)
        self.add_module("0", nn.Dropout(task.dropout))
        self.add_module("1", nn.Linear(width, out))

    @classmethod
    def serves(cls, task: Task, pair_encoding: str) -> bool:
        raise NotImplementedError

    @property
    def linear(self) -> nn.Linear:
        return self._modules["1"]

    def __getitem__(self, index: int) -> nn.Module:
        """head[0] the dropout, head[1] the linear layer, as in the nn.Sequential the heads were."""
        return self._modules[str(index)]

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """dropout + linear: [..., width] -> [..., out]."""
        return self._modules["1"](self._modules["0"](x))

    def forward(self, x: torch.Tensor):
        """The head's output in a training step, from its rows of sentence vectors [rows·b, D]
        (a pair's first sentences, then its second)."""
        return self.project(x)

    def forward_joint(self, bert_out: dict, rows: slice, attention_mask: torch.Tensor, encoder):
        """The output when a step's sentences and pairs went through BERT together (``--pair-encoding
        cross``): a sentence head reads its rows' sentence vectors, pooled as the encoder pools."""
        first = bert_out["first_layer_hidden_state"][rows] if encoder.pooling == FIRST_LAST_AVG else None
        u = pool(bert_out["last_hidden_state"][rows], attention_mask[rows], encoder.pooling, first)
        return self(encoder.transform(u))

    def label_tensor(self, labels: list) -> torch.Tensor:
        """A training set's labels [n] as :meth:`loss` takes them."""
        return torch.tensor(labels, dtype=self.label_dtype)

    def loss(self, out, labels: torch.Tensor) -> torch.Tensor:
        """The task's loss (a float32 scalar) on the head's output and the batch's labels [b]."""
        raise NotImplementedError

    def view(self, out) -> torch.Tensor:
        """What the task predicts from the head's output, as one tensor: logits, or a value (SMART
        compares it on perturbed inputs; evaluation keeps it as the raw output)."""
        return out

    def divergence(self, out):
        """SMART's l_s for :meth:`view` (Jiang et al. 2020): symmetric KL for logits, squared error
        for values."""
        return sym_kl_loss

    def scores(self, vectors: torch.Tensor, n: int) -> torch.Tensor:
        """The raw outputs (:meth:`view`) of ``n`` rows at evaluation, from their sentence vectors
        [rows·n, D] (rows: ``rows_per_example``; no gradient, eval mode), float32."""
        return self.project(vectors).float()

    def predictions(self, y: torch.Tensor) -> torch.Tensor:
        """Raw outputs -> predictions: a class (long) or a score in the task's range (float)."""
        return y.argmax(dim=-1)

    def positive_scores(self, y: torch.Tensor) -> torch.Tensor:
        """Raw outputs -> [n, C] scores in [0, 1] per class, for precision-recall curves."""
        return torch.softmax(y.float(), dim=-1)


@register
class ClassificationHead(TaskHead):
    """One sentence, C classes: logits [b, C] = linear(dropout(u)), cross-entropy."""

    name = "classification"
    projector = True

    def __init__(self, task: Task, widths: Widths):
        super().__init__(task, widths.sentence, task.num_classes)
        self.criterion = ClassificationLoss()

    @classmethod
    def serves(cls, task, pair_encoding):
        return task.kind == "classification"

    def loss(self, logits, labels):
        return self.criterion(logits, labels)


class CosinePairHead(TaskHead):
    """A pair encoded apart, each sentence projected: (p1, p2) [b, proj_dim] each (one call on both,
    so one dropout draw), and y = max(cos(p1, p2), h) [b] as its view."""

    rows_per_example = 2
    uses = frozenset({"proj_dim", "margin"})

    def __init__(self, task: Task, widths: Widths):
        super().__init__(task, widths.sentence, widths.proj)

    def forward(self, vectors):
        return self.project(vectors).chunk(2)

    def loss(self, out, labels):
        return self.criterion(*out, labels)

    def view(self, out):
        return clamped_cosine(*out, self.task.margin)

    def divergence(self, out):
        return squared_error_loss

    def scores(self, vectors, n):
        first, second = vectors.split(n)
        return clamped_cosine(self.project(first), self.project(second), self.task.margin)


@register
class CosineHingeHead(CosinePairHead):
    """Two classes by a cosine hinge (the report's QQP): duplicate when y >= (1 + h) / 2."""

    name = "cosine-hinge"
    pr_curve = True
    label_dtype = torch.float32  # 0.0 / 1.0, as its loss weighs the two terms

    def __init__(self, task: Task, widths: Widths):
        super().__init__(task, widths)
        self.criterion = HingeCosineLoss(task.margin)

    @classmethod
    def serves(cls, task, pair_encoding):
        return task.loss == "cosine-hinge" and pair_encoding == "bi"

    def predictions(self, y):
        return (y >= (1 + self.task.margin) / 2).long()

    def positive_scores(self, y):
        p = (y.float() - self.task.margin) / (1 - self.task.margin)
        return torch.stack([1 - p, p], dim=-1)


@register
class CosineRegressionHead(CosinePairHead):
    """A score regressed by the clamped cosine (the report's STS): the prediction is y rescaled from
    [h, 1] to the label range."""

    name = "cosine-mse"
    label_dtype = torch.float32

    def __init__(self, task: Task, widths: Widths):
        super().__init__(task, widths)
        self.criterion = CosineRegressionLoss(task.margin, task.label_range)

    @classmethod
    def serves(cls, task, pair_encoding):
        return task.loss == "cosine-mse" and pair_encoding == "bi"

    def predictions(self, y):
        low, high = self.task.label_range
        return (y.float() - self.task.margin) / (1 - self.task.margin) * (high - low) + low


@register
class SoftmaxPairHead(TaskHead):
    """A pair encoded apart, C classes from (u, v, |u - v|) [b, 3D] (SBERT's classifier, Reimers &
    Gurevych 2019; sentence-transformers' SoftmaxLoss), cross-entropy."""

    name = "softmax-pair"
    rows_per_example = 2
    pr_curve = True

    def __init__(self, task: Task, widths: Widths):
        super().__init__(task, 3 * widths.sentence, task.num_classes)
        self.criterion = ClassificationLoss()

    @classmethod
    def serves(cls, task, pair_encoding):
        return task.loss == "softmax" and pair_encoding == "bi"

    def forward(self, vectors):
        u, v = vectors.chunk(2)
        return self.project(torch.cat([u, v, (u - v).abs()], dim=-1))

    def loss(self, logits, labels):
        return self.criterion(logits, labels)

    def scores(self, vectors, n):
        return self(vectors).float()


@register
class CrossPairHead(TaskHead):
    """A pair encoded together, read through BERT's pooled [CLS] h [b, H]: one logit z [b] for two
    classes (binary cross-entropy; 1 when z >= 0), one score s [b] for a score (squared error
    against the gold scaled to [0, 1]; the prediction low + (high - low) s, clamped), else logits
    [b, C] (cross-entropy), as ``BertForSequenceClassification``."""

    name = "cross-pair"
    joint = True

    def __init__(self, task: Task, widths: Widths):
        one = task.regression or task.num_classes == 2
        super().__init__(task, widths.hidden, 1 if one else task.num_classes)
        self.criterion = PairScoreLoss(task.label_range) if task.regression else \
            PairLogitLoss() if one else ClassificationLoss()
        self.pr_curve = not task.regression
        self.label_dtype = torch.float32 if one else torch.long  # a score, or 0.0 / 1.0 for one logit

    @classmethod
    def serves(cls, task, pair_encoding):
        return task.kind in ("pair-classification", "pair-regression") and pair_encoding == "cross"

    def forward(self, pooled):
        """[b, H] pooled [CLS] -> [b] (one output) or [b, C], float32."""
        y = self.project(pooled).float()
        return y.squeeze(-1) if y.shape[-1] == 1 else y

    def forward_joint(self, bert_out, rows, attention_mask, encoder):
        return self(bert_out["pooler_output"][rows])

    def loss(self, out, labels):
        return self.criterion(out, labels)

    def divergence(self, out):
        if self.task.regression:
            return squared_error_loss
        return sym_kl_loss if out.dim() == 2 else binary_sym_kl_loss

    def predictions(self, y):
        if y.dim() == 2:
            return y.argmax(dim=-1)
        if self.task.regression:
            low, high = self.task.label_range
            return (low + (high - low) * y.float()).clamp(low, high)
        return (y >= 0).long()

    def positive_scores(self, y):
        if y.dim() == 2:
            return torch.softmax(y.float(), dim=-1)
        p = torch.sigmoid(y.float())
        return torch.stack([1 - p, p], dim=-1)


@register
class RegressionHead(TaskHead):
    """One sentence, a score: s = linear(dropout(u)) [b] (D x 1), squared error against the gold
    scaled from ``label_range`` to [0, 1] (sentence-transformers' MSELoss on a one-wide output);
    the prediction low + (high - low) s, clamped to the range."""

    name = "regression"
    label_dtype = torch.float32

    def __init__(self, task: Task, widths: Widths):
        super().__init__(task, widths.sentence, 1)
        self.criterion = PairScoreLoss(task.label_range)

    @classmethod
    def serves(cls, task, pair_encoding):
        return task.kind == "regression"

    def forward(self, vectors):
        """[b, D] -> [b] float32."""
        return self.project(vectors).float().squeeze(-1)

    def loss(self, scores, gold):
        return self.criterion(scores, gold)

    def divergence(self, out):
        return squared_error_loss

    def scores(self, vectors, n):
        return self(vectors)

    def predictions(self, y):
        low, high = self.task.label_range
        return (low + (high - low) * y.float()).clamp(low, high)


@register
class PairRankingHead(CosinePairHead):
    """Positive pairs (a_i, b_i) encoded apart, each sentence projected as the cosine heads do
    (p1, p2) [b, proj_dim]; every other pair's second sentence in the batch is a negative of a_i:
    MultipleNegativesRankingLoss, the cross-entropy of 20·cos(p1_i, p2_j) [b, b] against j = i
    (Henderson et al. 2017; sentence-transformers' loss of that name, scale 20, as CS224N projects
    trained paraphrase pairs). Its view is those logits [b, b]. At evaluation each dev pair's first
    sentence ranks every dev second sentence by cosine (retrieval over the dev set, as
    sentence-transformers' InformationRetrievalEvaluator): the raw output and the prediction are
    the reciprocal rank of its own second sentence (1 first, ties ranked against it), the metric
    their mean (MRR). Pairs are never read jointly: the negatives are other pairs' vectors."""

    name = "pair-ranking"
    scale = 20.0
    uses = frozenset({"proj_dim"})
    #: Dev rows ranked at a time (an [n, n] cosine matrix of a large dev set at once would not fit).
    ROWS = 1024

    def __init__(self, task: Task, widths: Widths):
        super().__init__(task, widths)
        self.criterion = MultipleNegativesRankingLoss(self.scale)

    @classmethod
    def serves(cls, task, pair_encoding):
        return task.kind == "pair-ranking" and pair_encoding == "bi"

    def loss(self, out, labels):
        return self.criterion(*out)  # the labels are all 1: the pair's own second sentence is the answer

    def view(self, out):
        return self.criterion.logits(*out)

    def divergence(self, out):
        return sym_kl_loss

    def scores(self, vectors, n):
        first, second = vectors.split(n)
        p1, p2 = self.project(first), self.project(second)
        ranks = []
        for start in range(0, n, self.ROWS):
            cos = cosine_matrix(p1[start:start + self.ROWS], p2)  # [rows, n]
            own = cos[torch.arange(len(cos)), torch.arange(start, start + len(cos))]
            ranks.append(1 + (cos > own[:, None]).sum(dim=-1))
        return 1.0 / torch.cat(ranks).float() if ranks else torch.empty(0)

    def predictions(self, y):
        return y.float()
