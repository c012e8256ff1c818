"""``--mini-batch-size M``: an in-batch objective's batch of any size in the memory of M rows, by a
gradient cache (GradCache: Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under
Memory Limited Setup", RepL4NLP; sentence-transformers' Cached* losses do the same).

An in-batch loss couples every row with every other (each anchor's candidates are the batch's
other sentences; BSL's predictor normalises over the batch), so the batch cannot be split into
micro-batches whose gradients add up: the backward pass needs every row's activations at once,
and memory grows with ``--batch-size``. The loss only reads the sentence vectors [b, D], though,
so ``embed_in_chunks`` splits the encoder's part instead:

(a) the rows go through the encoder M at a time, each chunk keeping its sentence vectors [M, D]
    but none of its activations (they are freed layer by layer, as in inference);
(b) the objective computes its loss on the whole batch's vectors, unchanged (its candidates,
    gathered from every rank under torchrun; its MLP head, flow or BatchNorm). The backward pass
    starts there and reaches the vectors first: d loss / d u of every row, the cached gradient;
(c) then, one chunk at a time, the chunk goes through the encoder again, this time keeping its
    activations, under the random state of its first pass, and its rows' d loss / d u is
    backpropagated through it into the encoder's parameters; its activations are freed before
    the next chunk's second pass starts. (The last chunk keeps its activations from its first
    pass instead: its backward comes first, so it needs no second pass.)

The random state: dropout draws its masks from torch's global generator (the CPU one, and on a GPU
the chunk's CUDA device's). Its state is captured before each chunk's first pass and restored for
the second, so the second pass draws the same masks; the state the run had is put back after it,
so a step leaves the generators where its first passes left them: the next step, and a run
resumed from a checkpoint, draw what a run that kept every chunk's activations would draw.
Random choices made on the host (span masks, CT's pairs) are drawn by the objective for the
whole batch before any chunk is embedded, once.

(a) and (c) are ``torch.utils.checkpoint`` (non-reentrant) around each chunk: it keeps the chunk's
inputs, drops the tensors its backward would need, and recomputes them, under the CPU and CUDA
generator states and the autocast state saved at the first pass, when the backward first needs
them. The autograd engine runs the most recently created nodes first, so the chunks' backward
passes, recomputation included, run one after another, last chunk first (tests/objectives/test_grad_cache.py
checks the order). Unlike a backward hook on a detached loss (sentence-transformers' way), the
graph from the loss to the parameters stays whole: the Trainer's step is unchanged (loss scaling
and clipping see the whole batch's gradient), and DistributedDataParallel sees which parameters
take part and reduces each gradient once, after the last chunk.

What it costs: one more forward pass of the encoder a step, less the last chunk's (measured:
docs/BENCHMARKS.md, "the gradient cache"); what it holds: one chunk's activations
(an objective that embeds through two encoders, CT, one chunk of each), the [b, D] vectors and
the loss's own [b, b] scores.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def row_chunks(ids: torch.Tensor, mask: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Host [b, t] ids and mask in chunks of ``size`` consecutive rows (the last may be smaller),
    each cut after its own last real token (a chunk of short sentences is not embedded at the
    batch's width; the values at the real tokens do not change)."""
    chunks = []
    for ids_k, mask_k in zip(ids.split(size), mask.split(size)):
        real = mask_k.any(0).nonzero()
        width = int(real.max()) + 1 if len(real) else mask_k.shape[1]
        chunks.append((ids_k[:, :width], mask_k[:, :width]))
    return chunks


def embed_in_chunks(embed, ids: torch.Tensor, mask: torch.Tensor, size: int, device, cache: bool) -> torch.Tensor:
    """``embed(ids, mask, num_tokens) -> [m, D]`` of host ``ids``, ``mask`` [b, t], ``size`` rows
    at a time (``row_chunks``), on ``device``: [b, D]. ``cache``: the gradient cache of the module
    docstring (the caller has gradients enabled and trains what ``embed`` runs); else the chunks
    are embedded one after another as they are (inference, or a frozen encoder: bounded memory,
    nothing to replay). A chunk's inputs go to the device before the first pass, so that the
    device's generator state is the one saved with it."""
    vectors = []
    chunks = row_chunks(ids, mask, size)
    for k, (ids_k, mask_k) in enumerate(chunks):
        num_tokens = int(mask_k.sum())  # on the host: no device synchronisation
        ids_k, mask_k = ids_k.to(device, non_blocking=True), mask_k.to(device, non_blocking=True)
        if cache and k < len(chunks) - 1:
            vectors.append(checkpoint(embed, ids_k, mask_k, num_tokens, use_reentrant=False, preserve_rng_state=True))
        else:
            # The last chunk keeps its activations from the first pass: its backward runs first,
            # before any other chunk's second pass, so one chunk's activations are alive at a
            # time all the same, and its second pass is saved.
            vectors.append(embed(ids_k, mask_k, num_tokens))
    return torch.cat(vectors)
