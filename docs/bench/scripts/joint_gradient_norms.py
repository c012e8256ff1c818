"""The two terms of the joint loss, on the flow's parameters, for one real batch: the gradient norm
of lambda * L_mirror(F(x)) against that of L_flow, with L_flow in nats and in bits per dimension
(issue 15). A fresh flow (seeded), its ActNorms initialised on the batch, the encoder frozen with
dropout on, as in the joint stage. Usage:

    PYTHONPATH=. python docs/bench/scripts/joint_gradient_norms.py MODEL_DIR SST_CSV [N [SEED]]
"""
import sys

import torch

from bertcf import SentenceEncoder
from bertcf.data.tasks import read_sst
from bertcf.models.flow import Glow, flow_loss, gaussian_nll
from bertcf.objectives.contrastive import InfoNCE, span_mask
from minbert import pad_batch

model, sst = sys.argv[1], sys.argv[2]
n, seed = (int(a) for a in (sys.argv[3:] + ["16", "11711"][len(sys.argv) - 3:])[:2])
torch.manual_seed(seed)
encoder = SentenceEncoder.from_pretrained(model)
encoder.train()
tok = encoder.tokenizer
sentences = [e.sentence for e in read_sst(sst)[:n]]
ids, mask = pad_batch(tok(sentences, truncation=True, max_length=32)["input_ids"], tok.pad_token_id)
special = torch.isin(ids, torch.tensor(tok.all_special_ids)) | (mask == 0)
masked = span_mask(ids, mask, special, tok.mask_token_id, 0.3, 5, torch.Generator().manual_seed(seed))
with torch.no_grad():
    u, u_masked = encoder.embed(torch.cat([ids, masked]), torch.cat([mask, mask])).chunk(2)
flow = Glow(encoder.dim, num_blocks=3).train()
flow(torch.cat([u, u_masked]))  # ActNorm's data-dependent initialisation, as on the first step


def grad_norm(loss) -> float:
    grads = torch.autograd.grad(loss, [p for p in flow.parameters() if p.requires_grad], allow_unused=True,
                                retain_graph=True)
    return torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None)).item()


z_both, logdet_both = flow(torch.cat([u, u_masked]))
z, z_masked = z_both.chunk(2)
nll = gaussian_nll(z, logdet_both.chunk(2)[0])
mirror = grad_norm(0.3 * InfoNCE(temperature=0.05)(z, z_masked))
print(f"D = {encoder.dim}, {n} sentences; |grad 0.3 L_mirror| = {mirror:.4g}")
for unit in ("nats", "bits-per-dim"):
    g = grad_norm(flow_loss(nll, encoder.dim, unit))
    print(f"{unit:>12}: |grad L_flow| = {g:.4g}, ratio L_flow / (0.3 L_mirror) = {g / mirror:.3g}")
