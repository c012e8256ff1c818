"""GPL's pseudo labels: a cross-encoder's margin CE(q, pos) - CE(q, neg) for each (query,
positive, negative) row (Wang et al. 2022, "GPL: Generative Pseudo Labeling for Unsupervised
Domain Adaptation of Dense Retrieval", NAACL, section 3), which MarginMSE then trains a bi-encoder
on (``objectives.margin_mse``).

The cross-encoder is loaded by sentence-transformers' ``CrossEncoder`` (a Hugging Face name or
directory: GPL's ``cross-encoder/ms-marco-MiniLM-L-6-v2``, or any ``BertForSequenceClassification``
directory, such as this project's ``python -m bertcf.cross`` writes). CE is its logit, before any
activation: GPL's margins are differences of logits, since its MS MARCO cross-encoders keep the
identity as their activation; a checkpoint saved with a sigmoid (sentence-transformers' default
for one output) would squeeze them into (-1, 1). A cross-encoder with two outputs (not relevant,
relevant) scores a pair by the log-odds of "relevant", logit_1 - logit_0."""
from __future__ import annotations

import numpy as np

from ..errors import UsageError
from ..runs import resolve_encoder_path
from ..utils.hub import load_failure


def load_cross_encoder(name: str, device=None, max_length: int | None = None):
    """sentence-transformers' ``CrossEncoder`` of ``name`` on ``device`` (a training run's directory
    stands for its best/ checkpoint, as for every encoder here); one that cannot be loaded is a
    UsageError naming it and why (not found, offline)."""
    from sentence_transformers import CrossEncoder

    try:
        model = CrossEncoder(str(resolve_encoder_path(name)), device=None if device is None else str(device),
                             max_length=max_length)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise load_failure("--cross-encoder", name, error) from None
    labels = model.config.num_labels
    if labels not in (1, 2):
        raise UsageError(f"--cross-encoder {name} has {labels} outputs; a relevance cross-encoder has one (a score) or "
                         f"two (not relevant, relevant)")
    return model


def scores(model, pairs: list[tuple[str, str]], batch_size: int = 32, show_progress_bar: bool = False) -> np.ndarray:
    """[n] float64: the cross-encoder's logit of each (query, passage) pair (two outputs: logit_1 - logit_0)."""
    import torch

    logits = np.asarray(model.predict(pairs, batch_size=batch_size, show_progress_bar=show_progress_bar,
                                      activation_fn=torch.nn.Identity(), convert_to_numpy=True), dtype=np.float64)
    logits = logits.reshape(len(pairs), -1)
    return logits[:, 0] if logits.shape[1] == 1 else logits[:, 1] - logits[:, 0]


def margins(model, rows, batch_size: int = 32, show_progress_bar: bool = False) -> list[tuple[str, str, str, float]]:
    """(query, positive, negative, CE(query, positive) - CE(query, negative)) of each row of
    ``rows`` (query, positive, negative), in order; each distinct (query, passage) pair is scored once."""
    pairs = list(dict.fromkeys([(q, p) for q, p, _ in rows] + [(q, n) for q, _, n in rows]))
    score = dict(zip(pairs, scores(model, pairs, batch_size, show_progress_bar).tolist()))
    return [(q, p, n, score[q, p] - score[q, n]) for q, p, n in rows]
