"""minBERT's self-attention exported as ONNX Runtime's fused ``com.microsoft::Attention`` operator.

ONNX Runtime's fast CPU attention (and its int8 form, ``QAttention``, which dynamic quantisation
makes of it) runs only where the graph holds that contrib operator. Its transformer optimizer
recognises the operator in the patterns of older exporters only: in the graph ``torch.onnx``
writes of ``scaled_dot_product_attention`` it fuses nothing. So the export says it directly:
each layer's attention becomes one op ``torch.ops.bertcf.attention`` (``attention_op``: the same
values in torch) that the exporter translates into ``Attention`` (``onnx_attention``), with the
layer's Q, K and V weights as one [D, 3D] matrix and the padding mask as its ``mask_index``.

    with fused_attention(encoder.bert):
        torch.onnx.export(..., custom_translation_table=TRANSLATION)
"""
from __future__ import annotations

from contextlib import contextmanager

import onnx
import torch
import torch.nn.functional as F
from onnx.defs import OpSchema

DOMAIN = "com.microsoft"


@torch.library.custom_op("bertcf::attention", mutates_args=())
def attention_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor,
                 num_heads: int) -> torch.Tensor:
    """x [b, t, D], weight [D, 3D] (Q, K, V side by side), bias [3D], mask [b, t] (1: a real
    token) -> [b, t, D], the heads concatenated: what ``Attention`` computes, in torch."""
    d = x.shape[-1]
    qkv = (x @ weight + bias).unflatten(-1, (3, num_heads, d // num_heads))
    q, k, v = (z.transpose(1, 2) for z in qkv.unbind(2))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].bool())
    return y.transpose(1, 2).flatten(2)


@attention_op.register_fake
def _(x, weight, bias, mask, num_heads):
    return torch.empty_like(x)


def _register_schema() -> None:
    """``Attention``'s signature for the exporter (ONNX knows no com.microsoft operator): the inputs
    and the one attribute this export uses (the operator has more, all optional)."""
    try:
        onnx.defs.get_schema("Attention", 1, DOMAIN)
        return
    except onnx.defs.SchemaError:
        pass
    p = OpSchema.FormalParameter
    onnx.defs.register_schema(OpSchema(
        "Attention", DOMAIN, 1, doc="ONNX Runtime's multi-head self-attention (contrib operator)",
        inputs=[p("input", "T"), p("weights", "T"), p("bias", "T"), p("mask_index", "M")], outputs=[p("output", "T")],
        type_constraints=[("T", ["tensor(float)"], "float"), ("M", ["tensor(int32)"], "the key padding mask")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "attention heads", required=True)]))


def onnx_attention(x, weight, bias, mask, num_heads: int):
    """The exporter's translation of ``attention_op``: one ``Attention`` node."""
    import onnxscript
    from onnxscript import opset18 as op

    _register_schema()
    microsoft = onnxscript.values.Opset(DOMAIN, 1)
    return microsoft.Attention(x, weight, bias, op.Cast(mask, to=onnx.TensorProto.INT32), num_heads=num_heads)


#: What ``torch.onnx.export`` gets as ``custom_translation_table``.
TRANSLATION = {torch.ops.bertcf.attention.default: onnx_attention}


@contextmanager
def fused_attention(bert):
    """Within it, every self-attention of ``bert`` (a minbert.BertModel on its padded path) runs
    as ``attention_op``, so an export writes it as ``Attention``; restored after."""
    layers = [layer.attention.self for layer in bert.encoder.layer]

    def fused(module):
        def forward(x, key_mask):
            weight = torch.cat([module.query.weight, module.key.weight, module.value.weight]).T
            bias = torch.cat([module.query.bias, module.key.bias, module.value.bias])
            return attention_op(x, weight, bias, key_mask.flatten(1).to(torch.int64), module.num_heads)
        return forward

    for module in layers:
        module.forward = fused(module)
    try:
        yield
    finally:
        for module in layers:
            del module.forward  # the class's forward again
