"""Attention alone, forward + backward, over the packed sentences of the bench's multitask
batches (288 sentences, bert-base's 12 heads of 64, bf16, dropout 0.1): flash attention over
cu_seqlens (what minBERT runs), the memory-efficient and cuDNN kernels over the same packed
sentences, and scaled_dot_product_attention over the batch padded to its longest sentence (the
kernel only, not the padding around it). Median of CUDA-event times. Usage:

    PYTHONPATH=. python docs/bench/scripts/attention_kernels_gpu.py
"""
import statistics

import torch
import torch.nn.functional as F

from bertcf.bench.workloads import Multitask
from minbert import BertConfig

aten = torch.ops.aten
config = BertConfig()
w = Multitask("multitask", config, torch.device("cuda"), "bf16", 4, 11713)
heads, d, p = config.num_attention_heads, config.hidden_size // config.num_attention_heads, 0.1
print(torch.cuda.get_device_name(), torch.__version__, "cuDNN", torch.backends.cudnn.version())


def variants(lengths):
    total, longest, b = sum(lengths), max(lengths), len(lengths)
    cu = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).int().cuda()
    q, k, v, g = (torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    mask = torch.arange(longest, device="cuda") < torch.tensor(lengths, device="cuda")[:, None]
    qp, kp, vp, gp = (torch.randn(b, heads, longest, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qp, kp, vp = (x.requires_grad_() for x in (qp, kp, vp))

    def run(out, inputs, grad):
        torch.autograd.grad(out, inputs, grad)

    return {
        "flash varlen": lambda: run(aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, p, False, False)[0],
                                    (q, k, v), g),
        "flash varlen, no dropout": lambda: run(
            aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, False, False)[0], (q, k, v), g),
        "efficient varlen": lambda: run(aten._efficient_attention_forward(
            q[None], k[None], v[None], None, cu, cu, longest, longest, p, 0, True)[0], (q, k, v), g[None]),
        "cudnn varlen": lambda: run(aten._cudnn_attention_forward(
            q, k, v, None, cu, cu, longest, longest, True, p, False, False)[0], (q, k, v), g),
        "sdpa padded (kernel only)": lambda: run(F.scaled_dot_product_attention(
            qp, kp, vp, attn_mask=mask[:, None, None, :], dropout_p=p), (qp, kp, vp), gp),
    }


times = {}
for (batch,) in w.batches:
    for name, fn in variants(list(batch.lengths)).items():
        try:
            for _ in range(3):
                fn()
            for _ in range(20):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.setdefault(name, []).append(start.elapsed_time(end))
        except Exception as e:  # a kernel this build or GPU lacks: say so, go on
            times[name] = str(e).splitlines()[0][:150]
for name, t in times.items():
    print(f"{name:28s}", f"{1e3 * statistics.median(t):8.1f} us per layer (fwd + bwd)" if isinstance(t, list) else t)
