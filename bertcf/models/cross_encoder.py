"""A cross-encoder on minBERT: both texts of a pair read together, ``[CLS] a [SEP] b [SEP]`` with
token types 0 and 1, and scored from BERT's pooled [CLS] vector (Nogueira & Cho 2019, "Passage
Re-ranking with BERT"; sentence-transformers' ``CrossEncoder``; Devlin et al. 2019, section 4.1).

The module tree is transformers' ``BertForSequenceClassification``: ``bert`` (a minbert.BertModel
with its pooler), then ``dropout`` (``classifier_dropout``, default the hidden dropout) and
``classifier`` Linear(hidden, num_labels). A checkpoint is that model's Hugging Face directory:
``config.json`` (``architectures: [BertForSequenceClassification]``, ``id2label``; the activation
sentence-transformers applies in ``predict``, under ``sentence_transformers.activation_fn``),
``model.safetensors`` (``bert.*`` and ``classifier.*``) and the tokenizer files (their
``model_max_length`` the pairs' length), so ``sentence_transformers.CrossEncoder(dir)`` loads it
and scores as :meth:`CrossEncoder.predict` does. Any such checkpoint loads here, by directory or by
hub name (e.g. ``cross-encoder/ms-marco-MiniLM-L-6-v2``), as minBERT loads ``bert-base-uncased``.
"""
from __future__ import annotations

import importlib
import json
import logging
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn

from minbert import BertConfig, BertModel, CheckpointError, load_tokenizer, pad_batch
from minbert.model import load_state_dict_file, resolve_checkpoint

from ..errors import UsageError
from ..runs import resolve_encoder_path
from ..utils.files import save_tensors_atomic, write_json_atomic
from ..utils.hub import load_failure
from ..utils.precision import autocast
from ..utils.progress import Progress, mode_of


def tokenize_pairs(tokenizer, first, second, max_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """``[CLS] a [SEP] b [SEP]`` ids and token types (0 for a, 1 for b), the longer text cut first:
    the tokenizer's pair encoding, as sentence-transformers' CrossEncoder calls it (stage 3's
    jointly encoded pairs use it too)."""
    encoded = tokenizer(list(first), list(second), truncation="longest_first", max_length=max_length,
                        return_token_type_ids=True, return_attention_mask=False)
    return encoded["input_ids"], encoded["token_type_ids"]


logger = logging.getLogger("bertcf.cross")

ARCHITECTURE = "BertForSequenceClassification"
SIGMOID = "torch.nn.modules.activation.Sigmoid"
IDENTITY = "torch.nn.modules.linear.Identity"
ST_MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
NO_LIMIT = 100_000  # a tokenizer's model_max_length above this means "none set" (transformers' VERY_LARGE_INTEGER)


def default_activation(num_labels: int) -> str:
    """sentence-transformers' default: a sigmoid on one logit, the logits as they are for several."""
    return SIGMOID if num_labels == 1 else IDENTITY


def activation_module(path: str) -> nn.Module:
    """The activation named by its import path (``torch.nn.modules.activation.Sigmoid``), built as
    sentence-transformers builds it: the class called without arguments."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)()
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise CheckpointError(f"the cross-encoder's activation {path!r} cannot be built ({type(e).__name__})") from None


def pad_pairs(ids: list[list[int]], types: list[list[int]], pad_token_id: int = 0):
    """Token-id and token-type lists -> input_ids, token_type_ids, attention_mask [b, longest]."""
    input_ids, mask = pad_batch(ids, pad_token_id)
    token_types = torch.zeros_like(input_ids)
    for i, row in enumerate(types):
        token_types[i, :len(row)] = torch.tensor(row)
    return input_ids, token_types, mask


def as_pairs(pairs) -> tuple[list[tuple[str, str]], bool]:
    """(the pairs as a list of two-text tuples, whether one pair was given alone)."""
    single = isinstance(pairs, (list, tuple)) and len(pairs) == 2 and all(isinstance(t, str) for t in pairs)
    pairs = [tuple(pairs)] if single else [tuple(p) for p in pairs]
    bad = next((p for p in pairs if len(p) != 2 or not all(isinstance(t, str) for t in p)), None)
    if bad is not None:
        raise UsageError(f"a cross-encoder scores pairs of two texts, not {bad!r}")
    return pairs, single


class CrossEncoder(nn.Module):
    """Text pairs -> scores. ``forward`` works on token ids (training), :meth:`predict` on text.

    ``num_labels`` 1: a score (regression, or a relevance logit); more: one logit per class.
    ``activation_fn``: the import path of what :meth:`predict` applies to the logits (default
    sentence-transformers': a sigmoid for one label, none for several). ``max_length``: tokens per
    pair (default the tokenizer's ``model_max_length``, never beyond the position embeddings)."""

    def __init__(self, bert: BertModel, tokenizer, num_labels: int = 1, max_length: int | None = None,
                 classifier_dropout: float | None = None, id2label: dict | None = None,
                 activation_fn: str | None = None):
        super().__init__()
        if num_labels < 1:
            raise UsageError(f"num_labels must be at least 1, not {num_labels}")
        config = bert.config
        self.bert, self.tokenizer, self.num_labels = bert, tokenizer, num_labels
        self.classifier_dropout = classifier_dropout
        self.dropout = nn.Dropout(config.hidden_dropout_prob if classifier_dropout is None else classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        nn.init.normal_(self.classifier.weight, std=config.initializer_range)  # transformers' initialisation
        nn.init.zeros_(self.classifier.bias)
        self.id2label = {int(k): v for k, v in (id2label or {i: f"LABEL_{i}" for i in range(num_labels)}).items()}
        limit = getattr(tokenizer, "model_max_length", None) or NO_LIMIT
        self.max_length = min(max_length or (limit if limit < NO_LIMIT else config.max_position_embeddings),
                              config.max_position_embeddings)
        self.activation_fn = activation_fn or default_activation(num_labels)
        self.activation = activation_module(self.activation_fn)
        self.precision = None  # autocast in predict(): bf16|fp16|fp32; None: bf16 on a GPU that has it, else fp32

    @property
    def device(self) -> torch.device:
        return next(self.bert.parameters()).device

    def forward(self, input_ids, attention_mask, token_type_ids=None, num_tokens: int | None = None) -> torch.Tensor:
        """[b, t] ids, mask and token types (``num_tokens``: the mask's sum, known on the host) ->
        the logits [b, num_labels], float32: classifier(dropout(pooler(h_[CLS])))."""
        pooled = self.bert(input_ids, attention_mask, token_type_ids, num_tokens=num_tokens)["pooler_output"]
        return self.classifier(self.dropout(pooled)).float()

    def tokenize(self, pairs) -> tuple[list[list[int]], list[list[int]]]:
        """The pairs' ids and token types, at most ``max_length`` tokens each."""
        pairs, _ = as_pairs(pairs)
        return tokenize_pairs(self.tokenizer, [p[0] for p in pairs], [p[1] for p in pairs], self.max_length)

    def logits(self, pairs, batch_size: int = 32, precision: str | None = None, show_progress_bar=False,
               name: str = "score") -> torch.Tensor:
        """The logits [n, num_labels] of ``pairs`` (two-text tuples), float32 on the CPU, in input
        order; in eval mode, pairs of similar length batched together. ``show_progress_bar`` (True or
        a mode of ``utils.progress``): the pairs scored so far and the time left, as ``name``."""
        pairs, _ = as_pairs(pairs)
        if not pairs:
            return torch.empty(0, self.num_labels)
        ids, types = self.tokenize(pairs)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first
        was_training, device, chunks = self.training, self.device, []
        self.eval()
        try:
            with torch.inference_mode(), Progress(mode_of(show_progress_bar), name, len(order), unit="pair") as shown:
                for start in range(0, len(order), batch_size):
                    rows = order[start:start + batch_size]
                    input_ids, token_types, mask = pad_pairs([ids[i] for i in rows], [types[i] for i in rows],
                                                             self.tokenizer.pad_token_id)
                    with autocast(device, precision or self.precision):
                        out = self(input_ids.to(device), mask.to(device), token_types.to(device),
                                   num_tokens=int(mask.sum()))
                    chunks.append(out.float().cpu())
                    shown.advance(len(rows))
        finally:
            self.train(was_training)
        logits = torch.empty(len(ids), self.num_labels)  # outside inference mode: an ordinary tensor
        logits[torch.tensor(order)] = torch.cat(chunks)
        return logits

    def predict(self, pairs, batch_size: int = 32, raw_logits: bool = False, apply_softmax: bool = False,
                precision: str | None = None) -> torch.Tensor:
        """What ``sentence_transformers.CrossEncoder.predict`` returns, as a tensor: the activation
        applied to the logits, [n] for one label ([] for one pair given alone), [n, num_labels]
        otherwise (``apply_softmax``: each row's softmax). ``raw_logits``: the logits themselves."""
        pairs, single = as_pairs(pairs)
        scores = self.logits(pairs, batch_size, precision)
        if not raw_logits:
            with torch.no_grad():
                scores = self.activation(scores)
        if self.num_labels == 1:
            scores = scores.squeeze(-1)
        elif apply_softmax:
            scores = torch.softmax(scores, dim=1)
        return scores[0] if single else scores

    def relevance(self, pairs, batch_size: int = 32, show_progress_bar=False, name: str = "score") -> torch.Tensor:
        """The log-odds [n] float32 that each pair (two-text tuples) is similar, relevant or a
        duplicate: the one logit, or of two the logit of label 1 less label 0's. Monotone in the
        probability (its sigmoid), but never saturated (a sigmoid rounds every logit above 17 to 1 in
        float32): what reranking sorts by, and CE in GPL's margins CE(q, pos) - CE(q, neg). A
        classifier of more than two labels gives none: a UsageError."""
        if self.num_labels > 2:
            raise UsageError(f"a cross-encoder of {self.num_labels} classes gives no similarity score (one label, "
                             f"or two with label 1 the similar pairs', does)")
        logits = self.logits(pairs, batch_size, show_progress_bar=show_progress_bar, name=name)
        return logits[:, 0] if self.num_labels == 1 else logits[:, 1] - logits[:, 0]

    def margins(self, rows, batch_size: int = 32, show_progress_bar=False) -> list[tuple[str, str, str, float]]:
        """(query, positive, negative, CE(query, positive) - CE(query, negative)) of each row of ``rows``
        (query, positive, negative), in order, CE the :meth:`relevance` (GPL's pseudo labels, Wang et al.
        2022, section 3); each distinct (query, passage) pair is scored once."""
        pairs = list(dict.fromkeys([(q, p) for q, p, _ in rows] + [(q, n) for q, _, n in rows]))
        scores = self.relevance(pairs, batch_size, show_progress_bar, name="margins").tolist()
        score = dict(zip(pairs, scores))
        return [(q, p, n, score[q, p] - score[q, n]) for q, p, n in rows]

    # ---- checkpoints -------------------------------------------------------------------
    def save_pretrained(self, directory) -> None:
        """A Hugging Face ``BertForSequenceClassification`` directory (see the module's docstring)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = self.bert.config.to_dict() | {
            "architectures": [ARCHITECTURE], "id2label": {str(i): label for i, label in self.id2label.items()},
            "label2id": {label: i for i, label in self.id2label.items()}, "classifier_dropout": self.classifier_dropout,
            "sentence_transformers": {"activation_fn": self.activation_fn}}
        write_json_atomic(directory / "config.json", config)
        tensors = {f"bert.{k}": v for k, v in self.bert.state_dict().items()}
        tensors |= {f"classifier.{k}": v for k, v in self.classifier.state_dict().items()}
        save_tensors_atomic(directory / "model.safetensors", tensors, metadata={"format": "pt"})
        self.tokenizer.model_max_length = self.max_length  # what sentence-transformers truncates the pairs to
        self.tokenizer.save_pretrained(str(directory))

    @classmethod
    def from_pretrained(cls, name_or_path, num_labels: int | None = None, max_length: int | None = None,
                        vocab=None, activation_fn: str | None = None, **config_overrides) -> "CrossEncoder":
        """A cross-encoder checkpoint (a directory, a run directory for its best/, or a hub name), or a
        plain BERT (its classifier freshly initialised: ``num_labels``, default 1). ``vocab``: a
        vocab.txt for a directory without tokenizer files; ``config_overrides``: config values
        (``hidden_dropout_prob=0.1``). Raises CheckpointError, in one line naming it, for what
        cannot be loaded (offline without a cached copy, not found, not a BERT)."""
        path = resolve_encoder_path(name_or_path)
        config_path, weights_path = resolve_checkpoint(path)
        raw = read_config(config_path)
        if raw.get("model_type", "bert") != "bert":
            raise CheckpointError(f"{name_or_path} is a {raw['model_type']} model; the cross-encoder is minBERT, "
                                  f"which loads BERT checkpoints only")
        state = load_state_dict_file(weights_path)
        head = {k.removeprefix("classifier."): v for k, v in state.items() if k.startswith("classifier.")}
        trained = head["weight"].shape[0] if "weight" in head else None
        if trained is not None and num_labels not in (None, trained):
            raise CheckpointError(f"{name_or_path} has a classifier of {trained} labels, not {num_labels}")
        bert = BertModel(replace(BertConfig.from_dict(raw), **config_overrides))
        bert.load_hf_state_dict({k: v for k, v in state.items() if not k.startswith("classifier.")},
                                source=str(name_or_path))
        labels = trained or num_labels or 1
        id2label = raw.get("id2label") if trained is not None and len(raw.get("id2label") or {}) == labels else None
        # A plain BERT or sentence encoder (MiniLM's modules.json: Transformer, Pooling, Normalize) starts
        # a cross-encoder with the default activation; a trained classifier brings its own.
        saved = saved_activation(path, raw) if head else None
        model = cls(bert, load_tokenizer(path, vocab_fallback=vocab), labels, max_length, raw.get("classifier_dropout"),
                    id2label, activation_fn or saved)
        if head:
            try:
                model.classifier.load_state_dict(head)
            except RuntimeError as e:
                why = " ".join(str(e).split())[:160]
                raise CheckpointError(f"{name_or_path}: its classifier does not fit ({why})") from None
        return model


def load_cross_encoder(name_or_path, flag: str, device=None, max_length: int | None = None,
                       precision: str | None = None) -> CrossEncoder:
    """The cross-encoder of ``flag`` (``--rerank``, ``--cross-encoder``) that scores relevance: a
    sequence classifier of one or two labels, on ``device``. A plain BERT or sentence encoder (it would
    load with an untrained classifier), a classifier of more labels, or what cannot be loaded is a
    UsageError or CheckpointError in one line naming it."""
    try:
        if not is_cross_encoder(name_or_path):
            raise UsageError(f"{flag} {name_or_path} is not a cross-encoder (a ...ForSequenceClassification "
                             f"checkpoint, as python -m bertcf.cross train writes)")
        model = CrossEncoder.from_pretrained(name_or_path, max_length=max_length)
    except CheckpointError as error:
        raise load_failure(flag, name_or_path, error) from None
    if model.num_labels > 2:
        raise UsageError(f"{flag} {name_or_path}: a cross-encoder of {model.num_labels} classes gives no relevance "
                         f"score (one label, or two: not relevant, relevant)")
    model.precision = precision
    return model.to(device) if device is not None else model


def is_cross_encoder(name_or_path) -> bool:
    """Whether a checkpoint (directory, run directory or hub name) is a sequence classifier, which
    this class loads, rather than a plain BERT or sentence encoder."""
    config_path, _ = resolve_checkpoint(resolve_encoder_path(name_or_path))
    architectures = read_config(config_path).get("architectures") or []
    return any(str(a).endswith("ForSequenceClassification") for a in architectures)


def read_config(path: Path) -> dict:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not a readable JSON file ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} is not a model configuration (a JSON object)")
    return raw


def _side_file(path, name: str) -> Path | None:
    """A file beside a checkpoint's config.json: in its directory, or from the hub (or its cache)."""
    if Path(path).is_dir():
        return Path(path) / name if (Path(path) / name).is_file() else None
    try:
        from huggingface_hub import hf_hub_download
        return Path(hf_hub_download(str(path), name))
    except Exception:  # absent from the repository, or offline without it in the cache
        return None


def saved_activation(path, raw: dict) -> str | None:
    """The activation a checkpoint names, where sentence-transformers looks, in its order: a
    sentence-transformers directory's ``config_sentence_transformers.json`` (with ``modules.json``),
    then config.json's ``sentence_transformers.activation_fn``, then the older
    ``sbert_ce_default_activation_function``; None: the default. As sentence-transformers without
    ``trust_remote_code``, a path outside ``torch.`` is ignored, with a warning."""
    modules = _side_file(path, ST_MODULES_FILE)
    if modules is not None:
        listed = read_config_list(modules)
        if len(listed) != 1 or not str(listed[0].get("type", "")).endswith("Transformer"):
            raise CheckpointError(f"{path} is a sentence-transformers model of {len(listed)} modules; the "
                                  f"cross-encoder loads a plain {ARCHITECTURE} (one Transformer module)")
    st_config = _side_file(path, ST_CONFIG_FILE) if modules is not None else None
    found = read_config(st_config).get("activation_fn") if st_config is not None else None
    found = found or (raw.get("sentence_transformers") or {}).get("activation_fn") \
        or raw.get("sbert_ce_default_activation_function")
    if found and not str(found).startswith("torch."):
        logger.warning("warning: %s names the activation %r, which is not torch's: using the default", path, found)
        return None
    return found


def read_config_list(path: Path) -> list:
    try:
        listed = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not a readable JSON file ({type(e).__name__})") from None
    if not isinstance(listed, list) or not all(isinstance(m, dict) for m in listed):
        raise CheckpointError(f"{path} is not a sentence-transformers module list")
    return listed
