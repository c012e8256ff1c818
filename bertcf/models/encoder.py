"""SentenceEncoder: minBERT + pooling (+ the Glow flow and a linear head when a checkpoint has them).

f(x) is the mean of the last layer over valid tokens (the report's choice), the [CLS] vector,
or first-last-avg, the mean of the first and the last layer's token means (``pool``); with a
flow, the encoder's output is the flow's latent F(x) = g^{-1}(f(x)); with a linear head
(``dense``: a whitening map, a projection), that head applied last, W F(x) + b.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn as nn

from minbert import BertModel, CheckpointError, load_tokenizer, pad_batch, tokenize

from ..cli import check_truncate_dim
from ..errors import UsageError
from ..runs import resolve_encoder_path
from ..utils.files import atomic_path, write_json_atomic
from ..utils.precision import autocast
from ..utils.progress import Progress, mode_of
from . import peft, st_format

ENCODER_FILE = "sentence_encoder.json"  # pooling and max_length of a saved SentenceEncoder
FLOW_FILE = "flow.safetensors"
FIRST_LAST_AVG = "first-last-avg"
POOLINGS = ("mean", "cls", FIRST_LAST_AVG)


def pool(last_hidden_state, attention_mask, pooling: str = "mean", first_hidden_state=None):
    """[b, t, D], [b, t] -> [b, D] in float32: the mean over the real tokens, the [CLS] vector, or
    first-last-avg, the average of the token means of ``first_hidden_state`` (the first
    transformer layer's output) and of the last layer.

    first-last-avg as BERT-whitening computes it (bojone/BERT-whitening, eng/utils.py: the outputs
    of bert4keras's 'Transformer-0-FeedForward-Norm' and of the last layer, each averaged over the
    real tokens, [CLS] and [SEP] included, then averaged): the *first transformer layer*, which is
    transformers' hidden_states[1], not the embeddings' output hidden_states[0]. BERT-flow's
    "avg-last-2" reads the same two layers (its all_encoder_layers[0] and [-1]); SimCSE's
    "avg_first_last" read hidden_states[0] until it was corrected to [1] (princeton-nlp/SimCSE
    issue 133)."""
    mask = attention_mask.unsqueeze(-1).to(torch.float32)

    def mean(hidden):
        return (hidden.float() * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    if pooling == "cls":
        return last_hidden_state[:, 0].float()
    if pooling == FIRST_LAST_AVG:
        if first_hidden_state is None:
            raise ValueError("first-last-avg pooling needs the first layer's output too (see pooled)")
        return (mean(first_hidden_state) + mean(last_hidden_state)) / 2
    return mean(last_hidden_state)


def pooled(bert, input_ids, attention_mask, pooling: str = "mean", token_type_ids=None,
           num_tokens: int | None = None, inputs_embeds=None) -> torch.Tensor:
    """``bert`` (a minbert.BertModel) run on a batch and pooled: [b, D] float32. first-last-avg asks
    it for its first layer's output as well (only then: other callers of this shape, such as the
    bench's transformers wrapper, need not know the flag); ``inputs_embeds`` [b, t, D], the word
    embeddings to use instead of the ids' (SMART's perturbed ones), likewise only when given."""
    extra = {"output_first_layer": True} if pooling == FIRST_LAST_AVG else {}
    if inputs_embeds is not None:
        extra["inputs_embeds"] = inputs_embeds
    out = bert(input_ids, attention_mask, token_type_ids, num_tokens=num_tokens, **extra)
    return pool(out["last_hidden_state"], attention_mask, pooling, out.get("first_layer_hidden_state"))


def quantized(vectors: torch.Tensor, precision: str = "float32", calibration=None) -> torch.Tensor:
    """``vectors`` [n, D] in ``precision`` (``bertcf.search.quantization.quantize_embeddings``), as
    a tensor; float32 returns them as they are. A bad precision or calibration is a UsageError."""
    from ..search.quantization import QuantizationError, quantize_embeddings

    if precision == "float32":
        return vectors
    if isinstance(calibration, torch.Tensor):
        calibration = calibration.float().numpy()
    try:
        return torch.from_numpy(quantize_embeddings(vectors.numpy(), precision, calibration_embeddings=calibration))
    except QuantizationError as e:
        raise UsageError(str(e)) from None


class SentenceEncoder(nn.Module):
    """Sentences -> vectors. ``forward`` works on token ids (for training); ``encode`` on text."""

    def __init__(self, bert: BertModel, tokenizer, pooling: str = "mean", flow=None, max_length: int = 128,
                 normalize: bool = False, dense: nn.Linear | None = None):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, not {pooling!r}")
        self.bert = bert
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.flow = flow
        self.dense = dense  # a linear head after pooling and the flow (sentence-transformers' Dense, identity)
        self.max_length = max_length
        self.normalize = normalize  # encode() returns unit vectors (a sentence-transformers Normalize module)
        self.precision = None  # autocast in encode(): bf16|fp16|fp32; None: bf16 on a GPU that has it, else fp32
        self.matryoshka_dims = None  # the widths it was trained at (Matryoshka), kept in its checkpoint
        self.truncate_dim = None  # encode() returns the first k dimensions (after any normalisation)
        self.adapters = None  # peft's adapters in ``bert`` (models/peft.py), saved beside its base weights

    @property
    def dim(self) -> int:
        """The width of f(x), the pooled vector (and of the flow, which keeps it): the hidden size."""
        return self.bert.config.hidden_size

    @property
    def output_dim(self) -> int:
        """The width of the vectors ``forward`` and ``encode`` return: the linear head's output, else ``dim``."""
        return self.dense.out_features if self.dense is not None else self.dim

    @property
    def device(self) -> torch.device:
        return next(self.bert.parameters()).device

    def embed(self, input_ids, attention_mask, token_type_ids=None, num_tokens: int | None = None,
              inputs_embeds=None):
        """f(x): the pooled encoder output [b, D], float32, before any flow. ``num_tokens``:
        the mask's sum, when known on the host (it spares the unpadded encoder a GPU sync).
        ``inputs_embeds`` [b, t, D]: word embeddings to use instead of the ids' (minBERT's)."""
        return pooled(self.bert, input_ids, attention_mask, self.pooling, token_type_ids, num_tokens,
                      inputs_embeds)

    def forward(self, input_ids, attention_mask, token_type_ids=None, num_tokens: int | None = None,
                inputs_embeds=None):
        """The sentence vector [b, output_dim]: f(x), then the flow's F(x) when there is one, then the
        linear head when there is one."""
        return self.transform(self.embed(input_ids, attention_mask, token_type_ids, num_tokens, inputs_embeds))

    def transform(self, u: torch.Tensor) -> torch.Tensor:
        """What follows the pooling: f(x) [b, D] -> the flow's F(x) when there is one, then the linear
        head when there is one, [b, output_dim]."""
        if self.flow is not None:
            u = self.flow(u)[0]
        if self.dense is not None:
            # In float32 whatever the autocast: a whitening map scales its smallest directions up by
            # 1/sqrt(eigenvalue), which would magnify bf16's rounding as much.
            with torch.autocast(u.device.type, enabled=False):
                u = self.dense(u.float())
        return u

    def _max_length(self, max_length: int | None = None) -> int:
        """``max_length`` (or the encoder's), never beyond the model's position embeddings."""
        return min(max_length or self.max_length, self.bert.config.max_position_embeddings)

    def tokenize(self, sentences, max_length: int | None = None):
        return tokenize(self.tokenizer, sentences, self._max_length(max_length))

    def token_ids(self, sentences, max_length: int | None = None) -> list[list[int]]:
        """Each sentence's token ids, [CLS] and [SEP] included, cut to ``max_length`` (default the
        encoder's; never beyond its position embeddings): what ``encode_ids`` takes."""
        return self.tokenizer(list(sentences), truncation=True, max_length=self._max_length(max_length))["input_ids"]

    def encode(self, sentences, batch_size: int = 64, show_progress_bar: bool = False,
               normalize: bool | None = None, max_length: int | None = None,
               truncate_dim: int | None = None, embedding_precision: str = "float32",
               calibration_embeddings=None) -> torch.Tensor:
        """Encode sentences to a float32 CPU tensor [n, D] (a single string gives [D]).

        Runs in eval mode under ``torch.inference_mode``; sentences of similar length are
        batched together (less padding) and the rows come back in input order. The result
        is an ordinary tensor (not an inference tensor), so it can feed autograd (e.g. a flow
        fitted on cached embeddings). ``truncate_dim`` (default the encoder's ``truncate_dim``):
        the vectors' first k dimensions (a Matryoshka-trained model's smaller widths), cut after
        the model's own normalisation and before the one ``normalize=True`` asks for, as
        sentence-transformers' ``truncate_dim`` and ``normalize_embeddings``. ``embedding_precision``
        int8, uint8 ([n, D]), binary or ubinary ([n, ceil(D/8)]): the vectors quantised last, as
        sentence-transformers' ``quantize_embeddings`` (``bertcf.search.quantization``), int8's
        ranges those of ``calibration_embeddings`` ([m, D] float vectors) or else of the vectors."""
        single = isinstance(sentences, str)
        sentences = [sentences] if single else list(sentences)
        vectors = torch.empty(0, self.output_dim)
        if sentences:
            vectors = self.encode_ids(self.token_ids(sentences, max_length), batch_size,
                                      show_progress_bar=show_progress_bar)
        if normalize is None and self.normalize:  # the model's Normalize module: before the cut, as in the model
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        vectors = self.truncated(vectors, truncate_dim)
        if normalize:  # as sentence-transformers' normalize_embeddings: after the cut
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        vectors = quantized(vectors, embedding_precision, calibration_embeddings)
        return vectors[0] if single else vectors

    def truncated(self, vectors: torch.Tensor, truncate_dim: int | None = None) -> torch.Tensor:
        """``vectors`` [..., output_dim] cut to their first ``truncate_dim`` (default the encoder's
        ``truncate_dim``; none: all) dimensions."""
        k = truncate_dim or self.truncate_dim
        if k is None:
            return vectors
        check_truncate_dim(k, self.output_dim, "the encoder")
        return vectors[..., :k]

    def encode_ids(self, token_ids, batch_size: int = 64, precision: str | None = None,
                   show_progress_bar: bool = False) -> torch.Tensor:
        """:meth:`encode` for sentences tokenised already (lists of ids): [n, D] float32 on the
        CPU, in input order. ``precision``: the autocast precision (default: the encoder's);
        ``show_progress_bar``: True (a bar on a terminal, plain lines in a log) or a mode of
        ``utils.progress``."""
        if not token_ids:
            return torch.empty(0, self.output_dim)
        order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))  # longest first
        was_training = self.training
        self.eval()
        device = self.device
        chunks = []
        try:
            with torch.inference_mode(), Progress(mode_of(show_progress_bar), "encode", len(order),
                                                  unit="sentence") as shown:
                for start in range(0, len(order), batch_size):
                    ids, mask = pad_batch([token_ids[i] for i in order[start:start + batch_size]],
                                          self.tokenizer.pad_token_id)
                    with autocast(device, precision or self.precision):
                        vectors = self(ids.to(device), mask.to(device), num_tokens=int(mask.sum()))
                    chunks.append(vectors.float().cpu())
                    shown.advance(len(ids))
        finally:
            self.train(was_training)
        # Outside inference mode, so that the result is a normal tensor.
        vectors = torch.empty(len(token_ids), chunks[0].shape[1])
        vectors[torch.tensor(order)] = torch.cat(chunks)
        return vectors

    # ---- checkpoints -------------------------------------------------------------------
    def save_pretrained(self, directory, link_weights_from=None) -> None:
        """A Hugging Face BERT directory (config.json, model.safetensors, tokenizer files)
        plus ``sentence_encoder.json``, with a flow ``flow.safetensors``, and the
        sentence-transformers layout (``bertcf.st_format``; the linear head is its standard Dense
        module, kept there only), so that ``SentenceTransformer(dir)`` returns the vectors of
        :meth:`encode`. ``link_weights_from``: see :meth:`minbert.BertModel.save_pretrained`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        peft.remove_adapter(directory)  # adapters saved there before, of any method or scope, are not these
        if self.adapters is not None:
            self.adapters.save(directory, link_weights_from)
        else:
            self.bert.save_pretrained(directory, link_weights_from)
        self.tokenizer.save_pretrained(str(directory))
        meta = {"pooling": self.pooling, "max_length": self.max_length, "flow": self.flow is not None,
                "normalize": self.normalize, "dense": self.dense is not None}
        if self.matryoshka_dims:
            meta["matryoshka_dims"] = list(self.matryoshka_dims)
        write_json_atomic(directory / ENCODER_FILE, meta)
        if self.flow is not None:
            with atomic_path(directory / FLOW_FILE) as tmp:
                self.flow.save(tmp)
        elif (directory / FLOW_FILE).exists():
            os.remove(directory / FLOW_FILE)
        st_format.write(directory, self.dim, self.pooling, self._max_length(),
                        directory / FLOW_FILE if self.flow is not None else None, self.normalize, self.dense)

    @classmethod
    def from_pretrained(cls, path, pooling: str | None = None, max_length: int | None = None,
                        vocab=None, task_adapters=(), **config_overrides) -> "SentenceEncoder":
        """Load a Hugging Face BERT (directory or hub name), a checkpoint written by this
        project, a sentence-transformers directory (its pooling, max_seq_length, Normalize, a Dense
        without activation and bertcf's flow are read; another module is a CheckpointError naming
        it), or a run
        directory (its ``best/`` is used). ``vocab``: a vocab.txt for directories that carry no
        tokenizer files. Arguments given win over what the directory says. ``task_adapters``: the
        tasks of a checkpoint with one adapter per task (--peft-scope per-task), loaded unmerged
        (``adapters``), as ``MultitaskModel.from_pretrained`` does; such a checkpoint is refused without.
        Houlsby adapters (--peft houlsby), which do not merge, are loaded unmerged too."""
        path = resolve_encoder_path(path)
        meta, layout = {}, {}
        if Path(path).is_dir():
            if (Path(path) / ENCODER_FILE).is_file():
                try:
                    meta = json.loads((Path(path) / ENCODER_FILE).read_text())
                except ValueError:
                    raise CheckpointError(f"{Path(path) / ENCODER_FILE} is not a readable JSON file") from None
            layout = {k: v for k, v in (st_format.read(path) or {}).items() if v is not None}
        bert = BertModel.from_pretrained(path, **config_overrides)
        bert, adapters = peft.load_adapters(path, bert, task_adapters)  # a peft adapter merged, Houlsby's not
        tokenizer = load_tokenizer(path, vocab_fallback=vocab)
        flow_file = Path(path) / FLOW_FILE if (Path(path) / FLOW_FILE).is_file() else layout.get("flow")
        flow = None
        if flow_file is not None:
            from .flow import Glow
            try:
                flow = Glow.load(flow_file)
            except ValueError as e:  # flow.py raises no project error: checkpoints carry it standalone
                raise CheckpointError(str(e)) from None
        dense = st_format.read_dense(layout["dense"], flow.dim if flow is not None else bert.config.hidden_size) \
            if layout.get("dense") is not None else None
        settings = layout | meta  # this project's own file first
        encoder = cls(bert, tokenizer, pooling=pooling or settings.get("pooling", "mean"), flow=flow,
                      max_length=max_length or settings.get("max_length", 128),
                      normalize=bool(settings.get("normalize", False)), dense=dense)
        encoder.matryoshka_dims = tuple(meta["matryoshka_dims"]) if meta.get("matryoshka_dims") else None
        encoder.adapters = adapters
        return encoder
