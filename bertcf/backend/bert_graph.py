"""minBERT's padded forward as the ONNX export writes it: the shape ONNX Runtime runs fastest on a CPU.

The same weights and values as ``minbert.BertModel(..., unpad=False)``, written for the graph
ONNX Runtime (1.32) makes of it at load time (docs/serving.md says why, from issue 60's operator
profile in docs/BENCHMARKS.md):

- attention: each layer's Q, K and V are three plain MatMuls, then ONNX Runtime's
  ``com.microsoft::MultiHeadAttention`` (the bias, the head split, the masked softmax and the
  weighted sum in one kernel). Its transformer optimizer fuses no attention from what
  ``torch.onnx`` writes for ``scaled_dot_product_attention``, so the export says it directly.
  The MatMuls are quantised in the int8 graph like every other weight, each with its own scale;
  the scores stay in float. (The ``Attention`` operator, which projects Q, K and V itself, runs
  that projection in float as a small product per batch row and head, and its int8 form
  ``QAttention`` quantised the [D, 3D] weight as one: 968 ms of 2.3 s, or 0.3 STS-B points, in
  issue 60's measurement.)
- GELU: ``com.microsoft::Gelu`` written directly. ONNX Runtime fuses an erf GELU only in the
  operand orders it knows, and the exporter writes another one (0.5 on the erf branch), which ran
  as four separate operators at 2.7x the cost; with the bias Add before it, Gelu becomes BiasGelu.
- LayerNorm: the standard ``LayerNormalization`` on the tokens as a [b·t, D] matrix. ONNX Runtime
  fuses a 3-D residual Add and the LayerNorm after it into ``SkipLayerNormalization``, whose CPU
  kernel took 38 ms a node in issue 60's profile against 5 ms for ``LayerNormalization`` on the
  same tensors (both graphs; transformers' int8 graph ran 6 of its 13 fused, the other 7 not, which
  was the whole "twice as slow"). In 2-D the fusion does not apply; ``flat=False`` keeps the 3-D
  tensors, for the bench to measure that choice again.
- embeddings: the token-type embedding of a single sentence (all type 0) is a constant, folded
  into the position table; no ``EmbedLayerNormalization`` (its CPU kernel normalises token by token
  in plain loops, as SkipLayerNormalization's does).

``fused=False`` writes standard ONNX operators only (``scaled_dot_product_attention`` with a key
mask, the activation as the model computes it), for runtimes other than ONNX Runtime.

    torch.onnx.export(module, ..., custom_translation_table=TRANSLATION)  # module.forward calls forward(bert, ...)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

DOMAIN = "com.microsoft"


def attend(q, k, v, bias, mask, num_heads: int):
    """q, k, v [b, t, D] (projected, no bias), bias [3D] (Q's, K's, V's), mask [b, t] int32 (1: a
    real token) -> [b, t, D], the heads concatenated: what ``MultiHeadAttention`` computes."""
    def heads(z):
        return z.unflatten(-1, (num_heads, -1)).transpose(1, 2)

    d = q.shape[-1]  # slices of the bias rather than a Split, which the export cannot fold
    q, k, v = q + bias[:d], k + bias[d:2 * d], v + bias[2 * d:]
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask[:, None, None, :].bool())
    return y.transpose(1, 2).flatten(2)


@torch.library.custom_op("bertcf::multihead_attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor,
                 num_heads: int) -> torch.Tensor:
    return attend(q, k, v, bias, mask, num_heads)


@attention_op.register_fake
def _(q, k, v, bias, mask, num_heads):
    return torch.empty_like(q)


@torch.library.custom_op("bertcf::gelu", mutates_args=())
def gelu_op(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


@gelu_op.register_fake
def _(x):
    return torch.empty_like(x)


def _register_schemas() -> None:
    """The contrib operators' signatures for the exporter (ONNX knows no com.microsoft operator):
    the inputs and attributes this export uses (the operators have more, all optional)."""
    import onnx
    from onnx.defs import OpSchema

    p, float_type = OpSchema.FormalParameter, ("T", ["tensor(float)"], "float")
    schemas = {
        "MultiHeadAttention": dict(
            inputs=[p("query", "T"), p("key", "T"), p("value", "T"), p("bias", "T"), p("key_padding_mask", "M")],
            type_constraints=[float_type, ("M", ["tensor(int32)"], "the key padding mask")],
            attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "attention heads", required=True)],
            doc="ONNX Runtime's multi-head attention on projected Q, K and V (contrib operator)"),
        "Gelu": dict(inputs=[p("X", "T")], type_constraints=[float_type], doc="ONNX Runtime's erf GELU"),
    }
    for name, schema in schemas.items():
        try:
            onnx.defs.get_schema(name, 1, DOMAIN)
        except onnx.defs.SchemaError:
            onnx.defs.register_schema(OpSchema(name, DOMAIN, 1, outputs=[p("output", "T")], **schema))


def onnx_attention(q, k, v, bias, mask, num_heads: int):
    import onnxscript

    _register_schemas()
    return onnxscript.values.Opset(DOMAIN, 1).MultiHeadAttention(q, k, v, bias, mask, num_heads=num_heads)


def onnx_gelu(x):
    import onnxscript

    _register_schemas()
    return onnxscript.values.Opset(DOMAIN, 1).Gelu(x)


#: What ``torch.onnx.export`` gets as ``custom_translation_table``.
TRANSLATION = {torch.ops.bertcf.multihead_attention.default: onnx_attention, torch.ops.bertcf.gelu.default: onnx_gelu}


def forward(bert, input_ids, attention_mask, token_type_ids=None, fused: bool = True, flat: bool = True,
            first_layer: bool = False):
    """``bert`` (a minbert.BertModel, in eval mode) on a padded batch: ids and mask [b, t] -> the
    last layer's hidden states [b, t, D], or with ``first_layer`` (last, first layer's). No
    ``token_type_ids``: every token is of type 0. ``fused``: ONNX Runtime's operators (module
    docstring); ``flat``: the layers on [b·t, D] (no SkipLayerNormalization)."""
    b, t = input_ids.shape
    emb = bert.embeddings
    positions = emb.position_embeddings.weight
    if token_type_ids is None:  # a constant, added to the table once (the export folds it)
        positions = positions + emb.token_type_embeddings.weight[0]
    x = emb.word_embeddings(input_ids) + positions[:t]
    if token_type_ids is not None:
        x = x + emb.token_type_embeddings(token_type_ids)

    def tokens(z):  # [b, t, D] -> what the layers compute on
        return z.flatten(0, 1) if flat else z

    x = emb.LayerNorm(tokens(x))
    mask = attention_mask.to(torch.int32)
    attention = attention_op if fused else attend
    first = None
    for layer in bert.encoder.layer:
        s = layer.attention.self
        # Q, K and V without their bias, which MultiHeadAttention adds as it splits the heads
        bias = torch.cat([s.query.bias, s.key.bias, s.value.bias])
        q, k, v = ((x @ m.weight.T).view(b, t, -1) for m in (s.query, s.key, s.value))
        a = tokens(attention(q, k, v, bias, mask, s.num_heads))
        x = layer.attention.output.LayerNorm(layer.attention.output.dense(a) + x)
        act = gelu_op if fused and bert.config.hidden_act == "gelu" else layer.intermediate.act
        x = layer.output.LayerNorm(layer.output.dense(act(layer.intermediate.dense(x))) + x)
        first = x if first is None else first
    last = x.view(b, t, -1)
    return (last, first.view(b, t, -1)) if first_layer else last
