"""Paired: MiniLM's multitask step (CPU, fp32) with the padded attention path as checked out
("current") against Q, K and V split before padding ("variant"), alternating in one process;
median of 6 steps each. Run at a commit before ff17bae, where "current" pads first:

    git worktree add /tmp/before bcc1b84 && cd /tmp/before && PYTHONPATH=. python /path/to/this.py /tmp/minilm
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import minbert.model as M
from bertcf.bench.models import Encoder, load_models
from bertcf.bench.workloads import Multitask

current = M.BertSelfAttention.forward


def variant(self, x, attn):
    d = x.shape[-1]
    weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
    bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
    qkv = F.linear(x, weight, bias).unflatten(-1, (3, self.num_heads, d // self.num_heads))
    dropout_p = self.dropout_p if self.training else 0.0
    if isinstance(attn, M.Packing):
        q, k, v = (attn.pad(t).transpose(1, 2) for t in qkv.unbind(1))  # [b, heads, t, head_dim]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn.key_mask, dropout_p=dropout_p)
        return attn.unpad(y.transpose(1, 2).flatten(2))
    return current(self, x, attn)


mb, _, _ = load_models(sys.argv[1])
w = Multitask("multitask", mb.config, torch.device("cpu"), "fp32", 4, 11713)
step = w.build(Encoder(mb))
times = {"current": [], "variant": []}
for i in range(8):
    for name in (("current", "variant") if i % 2 == 0 else ("variant", "current")):
        M.BertSelfAttention.forward = current if name == "current" else variant
        start = time.perf_counter()
        step(w.batches[i % 4])
        if i >= 2:
            times[name].append(time.perf_counter() - start)
print({k: round(1e3 * statistics.median(v), 1) for k, v in times.items()})
