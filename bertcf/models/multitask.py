"""The multitask model (the report's sections 4.3 and 5.3): one encoder, three heads on the
sentence vector f(x) (F(x) = g^{-1}(f(x)) when the checkpoint has a flow; then its linear head,
e.g. a whitening map, when it has one), their losses, their predictions and the dev metrics.

- SST-5 sentiment: dropout 0.3, linear D x 5, cross-entropy (:class:`SSTLoss`);
- QQP paraphrase: linear D x 768 on each question, y = max(cos(p1, p2), h) with h = 0.7,
  loss 1 - y for duplicates and y - h for the others (:class:`HingeCosineLoss`);
- STS similarity: dropout 0.1, linear D x 768 on each sentence, y = max(cos, h) with h = 0,
  gold scaled from [0, 5] to [h, 1], mean squared error (:class:`CosineRegressionLoss`);
- the step's loss 5 L_sst + 20 L_qqp + 1 L_sts (:class:`MultitaskLoss`).

With ``pair_encoding="cross"`` the QQP and STS heads read each pair encoded jointly instead,
``[CLS] s1 [SEP] s2 [SEP]`` with token types, through BERT's pooled [CLS] vector, as
``BertForSequenceClassification`` and the CS224N projects that encode pairs jointly do: QQP
dropout + linear D x 1, a logit, binary cross-entropy (:class:`PairLogitLoss`); STS dropout +
linear D x 1, a score regressed on the gold scaled to [0, 1] by mean squared error
(:class:`PairScoreLoss`). SST is as above.

The fine-tuning stage that trains it is ``bertcf.training.multitask``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert import CheckpointError

from ..data.tasks import TASKS  # the three tasks, in the order of a step's batch
from ..utils.files import save_tensors_atomic, write_json_atomic
from ..utils.precision import autocast
from .cross_encoder import pad_pairs
from .encoder import FIRST_LAST_AVG, SentenceEncoder, pool

HEADS_FILE = "heads.safetensors"
HEADS_CONFIG_FILE = "multitask.json"
NUM_SENTIMENTS = 5
COLUMNS = {"sst": 1, "qqp": 2, "sts": 2}  # sentences per example
PAIR_ENCODINGS = ("bi", "cross")  # a pair's sentences encoded apart (the report's) or together


def renamed_from_para(d: dict) -> dict:
    """``d`` (and the dicts inside it) with QQP's old name in keys replaced: 'para' -> 'qqp',
    'para_*' -> 'qqp_*' (flags para_batch_size, metric para_acc, tensors para_head.*). Files
    written before QQP had one name in the code (config.json, metrics.json, multitask.json,
    heads and training state) are read through it."""
    def key(k):
        return "qqp" + k[4:] if isinstance(k, str) and (k == "para" or k.startswith("para_")) else k
    return {key(k): renamed_from_para(v) if isinstance(v, dict) else v for k, v in d.items()}


# ---- losses ----------------------------------------------------------------------------------------
def clamped_cosine(a: torch.Tensor, b: torch.Tensor, margin: float) -> torch.Tensor:
    """y = max(cos(a_i, b_i), h) per row: [b, d], [b, d] -> [b] float32."""
    return F.cosine_similarity(a.float(), b.float(), dim=-1).clamp(min=margin)


class SSTLoss(nn.Module):
    """Cross-entropy of the SST-5 head (Socher et al. 2013, "Recursive Deep Models for Semantic
    Compositionality Over a Sentiment Treebank"; the CS224N default project's classifier).

    Inputs: ``logits`` [b, 5] (the head's output), ``labels`` [b] long in 0..4.
    Output: the mean cross-entropy, a float32 scalar."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels.long())


class HingeCosineLoss(nn.Module):
    """The QQP loss of BERT-CF (section 4.3): a cosine hinge on projected sentence vectors.

    With y = max(cos(p1, p2), h) per pair, the loss is 1 - y for duplicates (pull the pair to
    cosine 1) and y - h for non-duplicates (push the cosine below the margin h, where the clamp
    stops the gradient), averaged over the batch. Like sentence-transformers' OnlineContrastive /
    CosineSimilarityLoss family, but with a margin on the cosine (Reimers & Gurevych 2019,
    "Sentence-BERT").

    Inputs: ``p1``, ``p2`` [b, d] (the QQP head applied to each question), ``labels`` [b] in
    {0, 1} (1 = duplicate). Output: a float32 scalar. ``margin``: h (0.7 in the report)."""

    def __init__(self, margin: float = 0.7):
        super().__init__()
        self.margin = float(margin)

    def forward(self, p1: torch.Tensor, p2: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        y = clamped_cosine(p1, p2, self.margin)
        labels = labels.to(y.dtype)
        return (labels * (1 - y) + (1 - labels) * (y - self.margin)).mean()

    def extra_repr(self) -> str:
        return f"margin={self.margin}"


class CosineRegressionLoss(nn.Module):
    """The STS loss of BERT-CF (section 4.3): regress the clamped cosine of the projected
    sentence vectors onto the gold similarity (sentence-transformers' CosineSimilarityLoss,
    Reimers & Gurevych 2019, "Sentence-BERT", with a floor h on the cosine).

    y = max(cos(p1, p2), h); the gold score s in [0, 5] is scaled linearly to
    t = h + (1 - h) s / 5 in [h, 1]; loss = mean (y - t)^2.

    Inputs: ``p1``, ``p2`` [b, d] (the STS head applied to each sentence), ``scores`` [b] in
    [0, 5]. Output: a float32 scalar. ``margin``: h (0 in the report)."""

    def __init__(self, margin: float = 0.0):
        super().__init__()
        self.margin = float(margin)

    def forward(self, p1: torch.Tensor, p2: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        y = clamped_cosine(p1, p2, self.margin)
        target = scale_scores(scores.to(y.dtype), self.margin)
        return F.mse_loss(y, target)

    def extra_repr(self) -> str:
        return f"margin={self.margin}"


def scale_scores(scores: torch.Tensor, margin: float) -> torch.Tensor:
    """Gold STS scores [0, 5] -> [h, 1]."""
    return margin + (1 - margin) * scores / 5.0


class PairLogitLoss(nn.Module):
    """QQP on a jointly encoded pair: binary cross-entropy of the head's logit z [b] against the
    label y [b] in {0, 1}, mean over the batch of -(y log s(z) + (1 - y) log(1 - s(z))). Output:
    a float32 scalar."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class PairScoreLoss(nn.Module):
    """STS on a jointly encoded pair: mean squared error of the head's score y [b] against the
    gold s [b] in [0, 5] scaled to [0, 1], mean (y - s / 5)^2. Output: a float32 scalar."""

    def forward(self, scores: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(scores.float(), gold.float() / 5.0)


class MultitaskLoss(nn.Module):
    """The report's multitask objective: w_sst L_sst + w_qqp L_qqp + w_sts L_sts (5, 20 and 1),
    from :class:`SSTLoss`, :class:`HingeCosineLoss` and :class:`CosineRegressionLoss`.

    Inputs: ``out``, :meth:`MultitaskModel.forward`'s dict ({'sst': logits [b, 5], 'qqp':
    (p1, p2), 'sts': (p1, p2)}), and ``labels``, a dict of the same tasks ([b] each). Output:
    (the weighted sum, a float32 scalar; {task: its unweighted loss})."""

    def __init__(self, weights: dict, qqp_margin: float = 0.7, sts_margin: float = 0.0, pair_encoding: str = "bi"):
        super().__init__()
        self.weights = dict(weights)
        pairs = {"qqp": PairLogitLoss(), "sts": PairScoreLoss()} if pair_encoding == "cross" else {
            "qqp": HingeCosineLoss(qqp_margin), "sts": CosineRegressionLoss(sts_margin)}
        self.losses = nn.ModuleDict({"sst": SSTLoss(), **pairs})

    def forward(self, out: dict, labels: dict) -> tuple[torch.Tensor, dict]:
        parts = {}
        for task, y in out.items():
            args = tuple(y) if isinstance(y, tuple) else (y,)  # a bi-encoded pair's two projections
            parts[task] = self.losses[task](*args, labels[task])
        return sum(self.weights[t] * parts[t] for t in parts), parts


# ---- predictions and metrics -------------------------------------------------------------------
def predict_sentiment(logits: torch.Tensor) -> torch.Tensor:
    """[n, 5] -> [n] long: the argmax class."""
    return logits.argmax(dim=-1)


def predict_paraphrase(y: torch.Tensor, margin: float) -> torch.Tensor:
    """y = max(cos, h) [n] -> [n] long: 1 (duplicate) when y >= (1 + h) / 2."""
    return (y >= (1 + margin) / 2).long()


def predict_similarity(y: torch.Tensor, margin: float) -> torch.Tensor:
    """y = max(cos, h) [n] -> [n] float: y rescaled from [h, 1] to [0, 5]."""
    return (y.float() - margin) / (1 - margin) * 5.0


def predict_joint(task: str, y: torch.Tensor) -> torch.Tensor:
    """A jointly encoded pair's head output [n] -> QQP: 1 (duplicate) when the logit is >= 0 (even
    odds), long; STS: 5 y clamped to [0, 5], float."""
    return (y >= 0).long() if task == "qqp" else (5.0 * y.float()).clamp(0.0, 5.0)


# ---- the model -------------------------------------------------------------------------------------
class MultitaskModel(nn.Module):
    """A :class:`SentenceEncoder` and the three task heads on its sentence vector [b, D]
    (F(x) with a flow, else f(x)).

    - ``sst_head``: Dropout(sst_dropout) + Linear(D, 5) -> logits [b, 5]
    - ``qqp_head``: Dropout(qqp_dropout) + Linear(D, proj_dim) -> [b, proj_dim]
    - ``sts_head``: Dropout(sts_dropout) + Linear(D, proj_dim) -> [b, proj_dim]

    ``qqp_margin`` / ``sts_margin`` are the h of the QQP and STS similarity y = max(cos, h);
    they are part of the model because its predictions depend on them. ``pair_encoding="cross"``:
    the QQP and STS heads are Dropout + Linear(hidden, 1) on BERT's pooled [CLS] vector of the
    jointly encoded pair (the module's docstring).
    ``save_pretrained(dir)`` writes the encoder checkpoint plus ``heads.safetensors`` and
    ``multitask.json``; ``from_pretrained(dir)`` rebuilds the whole model."""

    def __init__(self, encoder: SentenceEncoder, proj_dim: int = 768, sst_dropout: float = 0.3,
                 qqp_dropout: float = 0.0, sts_dropout: float = 0.1, qqp_margin: float = 0.7,
                 sts_margin: float = 0.0, pair_encoding: str = "bi"):
        super().__init__()
        if pair_encoding not in PAIR_ENCODINGS:
            raise ValueError(f"pair_encoding must be one of {PAIR_ENCODINGS}, not {pair_encoding!r}")
        self.encoder = encoder
        d = encoder.output_dim  # the heads read what the encoder returns (after its flow and linear head)
        self.config = dict(proj_dim=proj_dim, sst_dropout=sst_dropout, qqp_dropout=qqp_dropout,
                           sts_dropout=sts_dropout, qqp_margin=qqp_margin, sts_margin=sts_margin,
                           pair_encoding=pair_encoding)
        self.qqp_margin, self.sts_margin = float(qqp_margin), float(sts_margin)
        self.pair_encoding = pair_encoding
        self.sst_head = nn.Sequential(nn.Dropout(sst_dropout), nn.Linear(d, NUM_SENTIMENTS))
        # cross: the pooler's output, BERT's hidden width, to one number
        width, out = (encoder.dim, 1) if pair_encoding == "cross" else (d, proj_dim)
        self.qqp_head = nn.Sequential(nn.Dropout(qqp_dropout), nn.Linear(width, out))
        self.sts_head = nn.Sequential(nn.Dropout(sts_dropout), nn.Linear(width, out))

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    def head(self, task: str) -> nn.Module:
        return {"sst": self.sst_head, "qqp": self.qqp_head, "sts": self.sts_head}[task]

    def forward(self, input_ids, attention_mask, sizes: dict, num_tokens: int | None = None,
                token_type_ids=None) -> dict:
        """One training step's outputs, from one encoder pass over all of its sentences.

        ``input_ids``, ``attention_mask`` [n, t]: the rows of each task of ``sizes`` (task ->
        number of examples, in the order of ``TASKS``), column by column: the SST sentences,
        then the QQP first and second questions, then the STS first and second sentences (see
        :func:`train_batch`). Returns {'sst': logits [b, 5], 'qqp': (p1, p2), 'sts': (p1, p2)}
        for the tasks in ``sizes``. One pass instead of one per task: a third of the kernel
        launches, and with the unpadded encoder the common padding costs nothing. Cross: one row
        per pair, ``token_type_ids`` [n, t] theirs, and 'qqp' and 'sts' the heads' outputs [b]
        (:meth:`forward_joint`)."""
        if self.pair_encoding == "cross":
            return self.forward_joint(input_ids, attention_mask, sizes, num_tokens, token_type_ids)
        tasks = [t for t in TASKS if t in sizes]
        u = self.encoder(input_ids, attention_mask, num_tokens=num_tokens)  # [n, D] float32
        parts = u.split([sizes[t] * COLUMNS[t] for t in tasks])
        out = {}
        for task, vectors in zip(tasks, parts):
            y = self.head(task)(vectors)  # both sentences of a pair in one call: one dropout draw
            out[task] = y if COLUMNS[task] == 1 else y.chunk(2)
        return out

    def forward_joint(self, input_ids, attention_mask, sizes: dict, num_tokens=None, token_type_ids=None) -> dict:
        """:meth:`forward` with jointly encoded pairs: one BERT pass over the SST sentences and the
        pairs (a row each); SST's head on the encoder's sentence vector, the pair heads on the
        pooled [CLS] vectors, squeezed to [b]."""
        encoder = self.encoder
        first_layer = encoder.pooling == FIRST_LAST_AVG
        out = encoder.bert(input_ids, attention_mask, token_type_ids, num_tokens=num_tokens,
                           output_first_layer=first_layer)
        result, start = {}, 0
        for task in [t for t in TASKS if t in sizes]:
            rows = slice(start, start + sizes[task])
            start = rows.stop
            if task == "sst":
                u = pool(out["last_hidden_state"][rows], attention_mask[rows], encoder.pooling,
                         out["first_layer_hidden_state"][rows] if first_layer else None)
                result[task] = self.sst_head(encoder.transform(u))
            else:
                result[task] = self.head(task)(out["pooler_output"][rows]).float().squeeze(-1)
        return result

    def joint_outputs(self, task: str, ids: list, types: list, batch_size: int = 128,
                      precision: str | None = None) -> torch.Tensor:
        """The pair head's outputs [n] (float32, CPU, input order) for pairs tokenised jointly
        (``ids``, ``types``: token ids and token types per pair), length-sorted batches, no
        gradient; the caller sets eval mode."""
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        device, chunks = self.device, []
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                input_ids, token_types, mask = pad_pairs([ids[i] for i in rows], [types[i] for i in rows],
                                                         self.encoder.tokenizer.pad_token_id)
                with autocast(device, precision or self.encoder.precision):
                    pooled = self.encoder.bert(input_ids.to(device), mask.to(device), token_types.to(device),
                                               num_tokens=int(mask.sum()))["pooler_output"]
                    chunks.append(self.head(task)(pooled).float().squeeze(-1).cpu())
        y = torch.empty(len(ids))
        if ids:
            y[torch.tensor(order)] = torch.cat(chunks)
        return y

    # ---- checkpoints -------------------------------------------------------------------------
    def heads_state_dict(self) -> dict:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("encoder.")}

    def save_pretrained(self, directory, extra: dict | None = None) -> None:
        """The encoder checkpoint (Hugging Face directory, flow.safetensors with a flow) plus
        ``heads.safetensors`` and ``multitask.json`` (head settings; ``extra`` is added)."""
        directory = Path(directory)
        self.encoder.save_pretrained(directory)
        save_tensors_atomic(directory / HEADS_FILE, self.heads_state_dict())
        write_json_atomic(directory / HEADS_CONFIG_FILE, self.config | (extra or {}))

    @classmethod
    def from_pretrained(cls, path, **encoder_kwargs) -> "MultitaskModel":
        """Rebuild a model written by :meth:`save_pretrained` (a run directory stands for its
        best/). Raises CheckpointError when ``path`` is not a multitask checkpoint."""
        from safetensors.torch import load_file

        path = resolve_checkpoint(path)
        config = renamed_from_para(checkpoint_meta(path)) if (path / HEADS_CONFIG_FILE).is_file() else {}
        encoder = SentenceEncoder.from_pretrained(path, **encoder_kwargs)
        model = cls(encoder, **{k: v for k, v in config.items() if k in cls.config_keys()})
        try:
            heads = renamed_from_para(load_file(str(path / HEADS_FILE)))
            result = model.load_state_dict(heads, strict=False)
            wrong = result.unexpected_keys + [k for k in result.missing_keys if not k.startswith("encoder.")]
            if wrong:
                raise ValueError(f"tensors {sorted(wrong)} do not match")
        except Exception as e:
            raise CheckpointError(f"{path / HEADS_FILE} does not fit the model ({e})") from None
        return model

    @staticmethod
    def config_keys():
        return ("proj_dim", "sst_dropout", "qqp_dropout", "sts_dropout", "qqp_margin", "sts_margin", "pair_encoding")


def checkpoint_meta(path) -> dict:
    """The ``multitask.json`` of a checkpoint (head settings and the step it was saved at)."""
    return json.loads((Path(path) / HEADS_CONFIG_FILE).read_text())


def resolve_checkpoint(path) -> Path:
    """A multitask checkpoint directory (holding heads.safetensors), or a run directory whose
    best/ is one."""
    p = Path(path)
    if (p / HEADS_FILE).is_file():
        return p
    if (p / "best" / HEADS_FILE).is_file():
        return p / "best"
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} not found")
    raise CheckpointError(f"{p} is not a multitask checkpoint or run directory (no {HEADS_FILE} in it or in its best/)")


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint belongs to: DIR for DIR/best (or DIR/last), else itself."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent if checkpoint.name in ("best", "last") else checkpoint

