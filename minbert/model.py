"""minBERT: a BERT encoder written from scratch, one readable file.

The module tree and parameter names mirror Hugging Face's ``BertModel`` exactly
(``embeddings.word_embeddings.weight``, ``encoder.layer.3.attention.self.query.weight``,
...), so a checkpoint maps onto minBERT by stripping at most a ``bert.`` prefix; the
mapping lives in ``_to_minbert_key`` below, in plain sight.

References: Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers";
the structure follows the Stanford CS224N minBERT starter and nanoGPT's model.py.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # in the order they are looked for


class CheckpointError(Exception):
    """A checkpoint that cannot be found or does not fit the model (one clear line)."""


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        """Read a Hugging Face ``config.json`` dict; keys minBERT does not use are ignored."""
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError(f"minBERT supports absolute position embeddings only, "
                                  f"not {d['position_embedding_type']!r}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_json_file(cls, path) -> "BertConfig":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict:
        """A config.json that ``transformers.BertModel`` reads."""
        return {"architectures": ["BertModel"], "model_type": "bert",
                "position_embedding_type": "absolute", **asdict(self)}


ACTIVATIONS = {
    "gelu": F.gelu,  # exact (erf) GELU, what BERT's "gelu" means
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def flash_attention_runs(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether :func:`flash_attention` can run: a CUDA GPU of compute capability 8.0 or
    later (A100, H100, RTX 30xx...; not a T4 or V100), half precision, head_dim <= 256."""
    return (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and head_dim <= 256
            and torch.cuda.get_device_capability(device) >= (8, 0))


def flash_attention(q, k, v, cu_seqlens, max_len: int, dropout_p: float) -> torch.Tensor:
    """Flash attention over packed sentences, attention dropout included.

    q, k, v: [T, heads, head_dim], sentence i in rows cu_seqlens[i]:cu_seqlens[i + 1]
    (cu_seqlens int32 [b + 1]); max_len: at least the longest sentence. Returns [T, heads,
    head_dim]. The public ``torch.nn.attention.varlen.varlen_attn`` has no dropout, and the
    report trains with attention dropout 0.1, so this calls the aten kernel under it, whose
    autograd formula replays the same dropout mask in the backward (tests/minbert/test_minbert.py
    checks that against an explicit computation). The memory-efficient kernel also takes
    dropout and spent less GPU time on the report's short sentences, but it made the eager
    training step slower on an H100 (docs/BENCHMARKS.md)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len,
                                                   dropout_p, False, False)[0]


class AttentionGroup(NamedTuple):
    """Sentences that attend together through ``scaled_dot_product_attention``, each padded to
    the group's longest (``t``): packed tokens go in through ``gather`` and come out through
    ``real``. A sentence's real tokens sit in its first slots, whatever holes its mask had
    (attention does not see positions)."""
    gather: torch.Tensor    # [n * t] the packed row each (sentence, slot) reads; padding slots read row 0
    key_mask: torch.Tensor  # [n, 1, 1, t] bool, True at the real tokens
    real: torch.Tensor      # [T_group] the slots of the flattened [n * t] that hold real tokens

    @classmethod
    def of(cls, starts: torch.Tensor, lengths: torch.Tensor, t: int, num_tokens: int) -> "AttentionGroup":
        """starts, lengths [n]: the sentences' first packed rows and their lengths; ``num_tokens``
        is lengths.sum(), given so that finding the real slots needs no GPU synchronisation."""
        slots = torch.arange(t, device=lengths.device)
        is_real = slots < lengths[:, None]  # [n, t]
        gather = torch.where(is_real, starts[:, None] + slots, 0).flatten()
        real = torch.nonzero_static(is_real.flatten(), size=num_tokens).squeeze(1)
        return cls(gather, is_real[:, None, None, :], real)


def length_groups(lengths: list[int], ratio: float = 0.75) -> list[list[int]]:
    """Sentence indices grouped by length, longest first: a group takes sentences down to
    ``ratio`` of its longest, so its padding wastes at most 1 / ratio^2 - 1 (78%) of its
    attention scores, where one group padded to the batch's longest sentence wastes most of
    them (a multitask batch of 288 sentences averages 18 tokens, its longest often 60+)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if not groups or lengths[i] < ratio * lengths[groups[-1][0]]:
            groups.append([])
        groups[-1].append(i)
    return groups


class Packing(NamedTuple):
    """Where the real tokens of a padded [b, t] batch sit, for the unpadded forward.

    The unpadded forward runs every token-wise module (embeddings, projections, feed-forward,
    LayerNorm, dropout) on the T real tokens only, as a [T, D] tensor: with the report's
    variable-length sentences, a padded batch is often two thirds padding. Only attention
    needs the sentence structure: :func:`flash_attention` over ``cu_seqlens`` where it can
    run (``groups`` is empty then), else ``scaled_dot_product_attention`` over ``groups`` of
    sentences, each padded to its own longest sentence."""
    indices: torch.Tensor     # [T] positions of the real tokens in the flattened [b * t] batch
    cu_seqlens: torch.Tensor  # [b + 1] int32: sentence i is packed rows cu_seqlens[i]:cu_seqlens[i + 1]
    shape: tuple[int, int]    # (b, t) of the padded batch
    groups: tuple[AttentionGroup, ...]
    restore: torch.Tensor | None  # [T] packed row -> row of the groups' concatenated outputs (None: same order)

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, num_tokens: int, by_length: bool | None = None,
                  flash: bool = False) -> "Packing":
        """``num_tokens``: the number of real tokens (known on the host where the batch was
        padded), so that finding them needs no device-to-host synchronisation. ``flash``:
        attention will run as :func:`flash_attention`, which needs no groups.

        Else, on the CPU the sentences attend in length groups (:func:`length_groups`): there
        attention with dropout runs the plain math kernel, whose cost grows with the padded
        length squared (it was most of a multitask step; docs/BENCHMARKS.md). On a GPU the
        lengths would have to reach the host (a synchronisation) and every group costs
        launches, so all sentences form one group, padded to the batch's width. ``by_length``
        overrides that choice (None: by length on the CPU only)."""
        indices = torch.nonzero_static(attention_mask.flatten().bool(), size=num_tokens).squeeze(1)
        lengths = attention_mask.sum(1, dtype=torch.long)
        cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
        starts, restore = cu_seqlens[:-1], None
        if by_length is None:
            by_length = attention_mask.device.type == "cpu"
        if flash:
            groups = ()
        elif not by_length:
            groups = (AttentionGroup.of(starts, lengths, attention_mask.shape[1], num_tokens),)
        else:
            host_lengths = lengths.tolist()
            members = length_groups(host_lengths)
            if len(members) == 1:
                groups = (AttentionGroup.of(starts, lengths, max(host_lengths), num_tokens),)
            else:
                groups = tuple(AttentionGroup.of(starts[m], lengths[m], host_lengths[m[0]],
                                                 sum(host_lengths[i] for i in m)) for m in map(torch.tensor, members))
                # The groups' outputs come out concatenated, group after group: put each row back.
                restore = torch.cat([g.gather[g.real] for g in groups]).argsort()
        return cls(indices, cu_seqlens.int(), tuple(attention_mask.shape), groups, restore)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[T, ...] -> [b, t, ...], zeros at the padding."""
        b, t = self.shape
        out = x.new_zeros(b * t, *x.shape[1:])
        return out.index_copy(0, self.indices, x).view(b, t, *x.shape[1:])


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, packing: Packing | None = None, inputs_embeds=None):
        """[b, t] ids -> [b, t, D]; with ``packing``, the real tokens only: [T, D].
        ``inputs_embeds`` [b, t, D]: the word embeddings to use instead of looking ``input_ids``
        up (transformers' argument; SMART perturbs them); the ids still give the shape."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if packing is not None:
            input_ids = input_ids.flatten()[packing.indices]
            token_type_ids = token_type_ids.flatten()[packing.indices]
            positions = packing.indices % positions.shape[0]  # a token's column is its position
            if inputs_embeds is not None:
                inputs_embeds = inputs_embeds.flatten(0, 1)[packing.indices]
        words = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        x = words + self.position_embeddings(positions) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention: over the packed sentences through :func:`flash_attention`
    on a GPU, else through ``scaled_dot_product_attention``. Q, K and V keep separate Linear
    modules so the names match Hugging Face, but run as one fused matmul on the concatenated
    weights."""

    def __init__(self, config: BertConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise CheckpointError(f"hidden_size {config.hidden_size} is not a multiple of "
                                  f"num_attention_heads {config.num_attention_heads}")
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x, attn):
        """x: [b, t, D] and attn the [b, 1, 1, t] boolean mask (True = a real token to attend
        to); or, unpadded, x: [T, D] and attn a :class:`Packing`. Returns x's shape."""
        d = x.shape[-1]
        projections = (self.query, self.key, self.value)
        if all(type(p) is nn.Linear for p in projections):
            weight = torch.cat([p.weight for p in projections])  # [3D, D]
            bias = torch.cat([p.bias for p in projections])
            qkv = F.linear(x, weight, bias)
        else:  # wrapped (peft's LoRA, DoRA, IA3): each is called, so that its adapter applies
            qkv = torch.cat([p(x) for p in projections], dim=-1)
        qkv = qkv.unflatten(-1, (3, self.num_heads, d // self.num_heads))
        dropout_p = self.dropout_p if self.training else 0.0
        if not isinstance(attn, Packing):
            return self._attend(*qkv.unbind(2), attn, dropout_p)
        q, k, v = qkv.unbind(1)  # each [T, heads, head_dim]
        if not attn.groups:
            return flash_attention(q, k, v, attn.cu_seqlens, attn.shape[1], dropout_p).flatten(1)
        # Where flash attention cannot run (the CPU, fp32, older GPUs), pad the packed Q, K, V of
        # each group of sentences for scaled_dot_product_attention and pack its output again.
        # Split before padding, so that the backward of the split joins gradients of the real
        # tokens only (faster on the CPU; docs/BENCHMARKS.md has the figure).
        outputs = []
        for group in attn.groups:
            n, t = group.key_mask.shape[0], group.key_mask.shape[-1]
            qg, kg, vg = (z.index_select(0, group.gather).unflatten(0, (n, t)) for z in (q, k, v))
            y = self._attend(qg, kg, vg, group.key_mask, dropout_p)  # [n, t, D]
            outputs.append(y.flatten(0, 1).index_select(0, group.real))
        y = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
        return y if attn.restore is None else y.index_select(0, attn.restore)

    @staticmethod
    def _attend(q, k, v, key_mask, dropout_p):
        """q, k, v [b, t, heads, head_dim] -> [b, t, D] through scaled_dot_product_attention."""
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=key_mask, dropout_p=dropout_p)
        return y.transpose(1, 2).flatten(2)  # heads concatenated again


class BertSelfOutput(nn.Module):
    """Attention output projection, dropout, residual, post-LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual):
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x, attn):
        return self.output(self.self(x, attn), x)


class BertIntermediate(nn.Module):
    """First feed-forward layer with the activation (GELU for BERT)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        if config.hidden_act not in ACTIVATIONS:
            raise CheckpointError(f"unsupported hidden_act {config.hidden_act!r} (supported: {', '.join(ACTIVATIONS)})")
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x):
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    """Second feed-forward layer, dropout, residual, post-LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual):
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, attn):
        x = self.attention(x, attn)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertPooler(nn.Module):
    """tanh(W · h_[CLS] + b), BERT's next-sentence-prediction pooler."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden):
        return torch.tanh(self.dense(hidden[:, 0]))


class BertModel(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)
        self.apply(self._init_weights)
        self.attend_by_length: bool | None = None  # None: on the CPU only (Packing.from_mask)

    def _init_weights(self, module):
        # BERT's initialisation: N(0, 0.02) weights, zero biases, LayerNorm at identity.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, output_hidden_states=False,
                num_tokens: int | None = None, unpad: bool = True, output_first_layer: bool = False,
                inputs_embeds=None):
        """input_ids, attention_mask, token_type_ids: [b, t] (mask 1 = real token, 0 = padding);
        ``inputs_embeds`` [b, t, D], when given, replaces the word embeddings of ``input_ids``
        (:class:`BertEmbeddings`).

        Returns {'last_hidden_state': [b, t, D], 'pooler_output': [b, D]} and, when
        ``output_hidden_states``, 'hidden_states': the embeddings' output and every layer's; when
        ``output_first_layer``, 'first_layer_hidden_state' [b, t, D]: the first layer's output
        alone (transformers' hidden_states[1], which first-last-avg pooling reads).

        A batch with padding runs unpadded (see :class:`Packing`): the same values at the
        real tokens, and zeros at the padding (where a padded forward computes values
        nothing should read). ``num_tokens``, the mask's sum when the caller knows it, spares
        a GPU synchronisation; ``unpad=False`` computes the padding too.
        """
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        packing = None
        if attention_mask is not None and unpad:
            if num_tokens is None:  # a GPU synchronisation: callers that pad on the host pass the count
                num_tokens = int(torch.count_nonzero(attention_mask))
            if num_tokens != input_ids.numel():  # else there is no padding to skip
                packing = Packing.from_mask(attention_mask, num_tokens, self.attend_by_length,
                                            flash=self._flash_attention_runs(input_ids.device))
        if packing is not None:
            attn = packing
        elif attention_mask is None:
            attn = None  # every token attends to every token
        else:  # [b, 1, 1, t] boolean: every query may attend to the real tokens of its sentence
            attn = attention_mask.bool()[:, None, None, :]
        x = self.embeddings(input_ids, token_type_ids, packing, inputs_embeds)
        hidden_states, first = [x], None
        for i, layer in enumerate(self.encoder.layer):
            x = layer(x, attn)
            if output_hidden_states:  # else hold no reference, so inference can free each layer's output
                hidden_states.append(x)
            if i == 0 and output_first_layer:
                first = x
        if packing is not None:
            x = packing.pad(x)
            hidden_states = [packing.pad(h) for h in hidden_states] if output_hidden_states else hidden_states
            first = packing.pad(first) if output_first_layer else None
        out = {"last_hidden_state": x, "pooler_output": self.pooler(x)}
        if output_hidden_states:
            out["hidden_states"] = tuple(hidden_states)
        if output_first_layer:
            out["first_layer_hidden_state"] = first
        return out

    def _flash_attention_runs(self, device: torch.device) -> bool:
        # Under autocast the layers compute in its dtype, else in the weights'.
        dtype = (torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type)
                 else self.embeddings.word_embeddings.weight.dtype)
        return flash_attention_runs(device, dtype, self.config.hidden_size // self.config.num_attention_heads)

    def compile_layers(self, **kwargs) -> None:
        """``torch.compile`` each layer rather than the whole model: the twelve layers share one
        compiled graph, compiled once for every batch shape (``dynamic=True``: the number of
        real tokens changes from batch to batch), and the packing stays outside it. Attention
        runs over one group of sentences then: every new number of length groups would compile
        the layer again."""
        self.attend_by_length = False
        for layer in self.encoder.layer:
            layer.compile(**({"dynamic": True} | kwargs))

    # ---- checkpoints -------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path, **config_overrides) -> "BertModel":
        """Load a Hugging Face BERT checkpoint: a local directory holding ``config.json`` and
        ``model.safetensors`` or ``pytorch_model.bin``, or a hub name such as
        ``bert-base-uncased`` (through huggingface_hub and its local cache). A directory with a
        ``config.json`` and no weights gives a model with random weights (BERT's initialisation,
        from torch's global generator), with a one-line note: pretraining from scratch.
        ``config_overrides`` (e.g. ``hidden_dropout_prob=0.1``) replace config values."""
        path = Path(name_or_path)
        if path.is_dir() and (path / "config.json").is_file() and not has_weights(path):
            config_path, weights_path = path / "config.json", None
        else:
            config_path, weights_path = resolve_checkpoint(name_or_path)
        config = replace(BertConfig.from_json_file(config_path), **config_overrides)  # a misspelt key is a TypeError
        model = cls(config)
        if weights_path is None:
            print(f"minbert: {path} holds a config.json and no weights: starting from random weights")
        else:
            model.load_hf_state_dict(load_state_dict_file(weights_path), source=str(name_or_path))
        return model

    def load_hf_state_dict(self, state_dict: dict, source: str = "checkpoint") -> None:
        """Copy a Hugging Face BertModel / BertForMaskedLM / BertForPreTraining state dict
        into this model. Unused heads are ignored with a one-line note; missing keys or
        mismatched shapes raise a CheckpointError that lists them."""
        own = self.state_dict()
        mapped, ignored = {}, []
        for key, tensor in state_dict.items():
            name = _to_minbert_key(key)
            if name in own:
                mapped[name] = tensor
            else:
                ignored.append(key)
        missing = sorted(set(own) - set(mapped))
        if "pooler.dense.weight" in missing and not any(k.startswith("pooler.") for k in mapped):
            # BertForMaskedLM checkpoints have no pooler: keep its fresh initialisation.
            missing = [k for k in missing if not k.startswith("pooler.")]
            print(f"minbert: {source} has no pooler; pooler_output uses freshly initialised weights")
        bad_shapes = [f"{k} {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in mapped.items()
                      if v.shape != own[k].shape]
        if missing or bad_shapes:
            problems = ([f"missing: {', '.join(missing)}"] if missing else []) + \
                       ([f"shape mismatch: {'; '.join(bad_shapes)}"] if bad_shapes else [])
            raise CheckpointError(f"{source} does not fit minBERT ({' | '.join(problems)})")
        unused = [k for k in ignored if not k.endswith("position_ids")]  # a buffer, not a weight
        if unused:
            prefixes = sorted({".".join(k.split(".")[:2]) for k in unused})
            print(f"minbert: ignored {len(unused)} tensors minBERT does not use ({', '.join(prefixes)})")
        self.load_state_dict({k: v.to(own[k].dtype) for k, v in mapped.items()}, strict=False)

    def save_pretrained(self, directory, link_weights_from=None, state_dict: dict | None = None) -> None:
        """Write ``config.json`` + ``model.safetensors`` that ``transformers.BertModel`` loads.

        ``link_weights_from``: a ``model.safetensors`` written earlier from these very weights
        (a frozen encoder's previous checkpoint); it is hard-linked rather than written again,
        or copied where the file system has no hard links. ``state_dict``: the tensors to write
        instead of the model's own (an adapted model's base weights, under their own names)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(directory / "config.json", json.dumps(self.config.to_dict(), indent=2) + "\n")
        tmp = directory / "model.safetensors.tmp"
        tmp.unlink(missing_ok=True)
        if link_weights_from is not None:
            try:
                os.link(link_weights_from, tmp)
            except OSError:
                shutil.copyfile(link_weights_from, tmp)
        else:
            own = self.state_dict() if state_dict is None else state_dict
            tensors = {k: v.detach().contiguous().cpu() for k, v in own.items()}
            save_file(tensors, str(tmp), metadata={"format": "pt"})
            os.chmod(tmp, default_file_mode())  # readable by others on a shared server, like config.json
        os.replace(tmp, directory / "model.safetensors")


def _to_minbert_key(key: str) -> str:
    """Hugging Face checkpoint key -> minBERT parameter name."""
    key = key.removeprefix("bert.")  # BertForMaskedLM / BertForPreTraining / classifier checkpoints
    # Checkpoints converted from the original TensorFlow release name LayerNorm parameters gamma/beta.
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def has_weights(directory) -> bool:
    """Whether a checkpoint directory holds weights (model.safetensors or pytorch_model.bin)."""
    return any((Path(directory) / name).is_file() for name in WEIGHT_FILES)


def resolve_checkpoint(name_or_path) -> tuple[Path, Path]:
    """(config.json, weights file) for a local directory or a hub name."""
    path = Path(name_or_path)
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise CheckpointError(f"{path} has no config.json")
        for weights in WEIGHT_FILES:
            if (path / weights).is_file():
                return config, path / weights
        raise CheckpointError(f"{path} has neither model.safetensors nor pytorch_model.bin")
    if path.is_file():
        raise CheckpointError(f"{path} is a file; pass the checkpoint directory that holds config.json "
                              f"and the weights")
    if path.exists() or str(name_or_path).startswith((".", "/")):
        raise CheckpointError(f"checkpoint directory {name_or_path} not found")
    return _from_hub(str(name_or_path))


def _from_hub(name: str) -> tuple[Path, Path]:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:  # pragma: no cover - huggingface_hub is a requirement
        raise CheckpointError(f"{name} is not a local directory and huggingface_hub is not installed") from e
    try:
        config = Path(hf_hub_download(name, "config.json"))
    except Exception as e:
        raise CheckpointError(f"cannot load {name!r}: not a local directory, and the Hugging Face hub "
                              f"(or its local cache) does not have it: {hub_failure(e)} ({type(e).__name__})") from None
    for weights in WEIGHT_FILES:
        try:
            return config, Path(hf_hub_download(name, weights))
        except Exception:
            continue
    raise CheckpointError(f"cannot load weights of {name!r} from the hub or its cache")


def hub_failure(error: Exception) -> str:
    """Why the hub did not give a file, in words: offline (or unreachable) with no cached copy, no
    such model, or a gated one; else the error's first line."""
    kind = type(error).__name__
    if kind in ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError",
                "RemoteEntryNotFoundError"):
        return "no such model on the hub"
    if kind == "GatedRepoError":
        return "a gated model (log in with an account that has access)"
    if kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionError", "ConnectTimeout",
                "ReadTimeout", "ProxyError"):
        return "offline or the hub unreachable, and no copy in the local cache"
    return str(error).strip().splitlines()[0][:120] if str(error).strip() else "unknown"


def load_state_dict_file(path) -> dict:
    """Tensors of a ``model.safetensors`` or ``pytorch_model.bin`` file; a truncated or corrupt
    file is a CheckpointError naming it."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors' SafetensorError, torch's pickle and zip errors, EOFError
        raise CheckpointError(f"{path} is truncated or corrupt ({type(e).__name__}: {str(e)[:120]}); "
                              f"write it again from its run, or use another checkpoint") from None


def default_file_mode() -> int:
    """The mode ``open()`` gives a new file (0o666 less the umask); safetensors writes 0o600."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
