"""Benchmark minBERT against ``transformers.BertModel`` (sdpa attention) on this project's workloads.

    python -m bertcf.bench --model NAME_OR_DIR --device cpu|cuda [--precision bf16|fp16|fp32]
                           [--steps N] [--warmup N] [--workloads mirror,joint,multitask,encode] [--json OUT]
    python -m bertcf.bench --onnx EXPORT_DIR --senteval-dir DIR [--threads N] [--steps N] [--warmup N]
                           [--onnx-graph NAME=FILE ...]
    python -m bertcf.bench --search VECTORS.npy|random [--search-n N] [--search-queries Q] [--search-k K]

One process, one run: both models get the same config, the same weights (minBERT's state dict
loaded into the transformers model) and the same inputs, and their steps alternate so that a
shared or throttling machine slows both alike. ``--model`` is a checkpoint directory, a
directory (or file) with only a ``config.json`` (random weights: fine for timing), or a hub
name; ``--tiny`` is a 2-layer, hidden-32 config for tests.

Workloads (the report's settings):
  mirror     the pretraining stage's objective (bertcf.objectives.Mirror): 16 sentences, their
             span-masked views drawn on the host, one forward of 32, max length 32, mean
             pooling, InfoNCE, backward, AdamW step at the stage's lr.
  joint      bertcf.objectives.Joint: the encoder frozen (no_grad, dropout on as in the stage),
             a 3-block Glow on both views, 0.3 * InfoNCE(F(x)) + L_flow, AdamW on the flow.
  multitask  bertcf.multitask's step: 32 SST + 96 x 2 QQP + 32 x 2 STS sentences in one encoder
             pass, the heads (SST dropout 0.3 + linear D x 5; QQP linear D x 768; STS dropout
             0.1 + linear D x 768), each head's loss weighted (5 / 20 / 1) by StepMethods, its backward,
             AdamW step. Its variants (multitask-*, on the same batches) change one setting of the run:
             the task sampling, the conflict logging, a multitask method, or adapters (multitask-lora,
             -dora, -ia3, -houlsby and their -per-task forms: run_multitask.py --peft X [--peft-scope
             per-task], the default settings, in a copy of the encoder; peft's skipped without peft).
  encode     inference throughput: --encode-sentences sentences, length-sorted batches of 64,
             eval mode under torch.inference_mode.
``--onnx EXPORT_DIR`` times something else, on the CPU: ``encode()`` of STS-B test's 2,758
sentences (length-sorted batches of 64) by the exported checkpoint under torch fp32, by
transformers' BertModel of the same weights, and under ONNX Runtime (``OnnxEncoder``) by each graph
of ``bench.onnx_variants``: minBERT's export (fused and plain, 2-D and 3-D LayerNorm inputs, int8
the export's dynamic with Q/K/V left in float, blockwise in blocks of 32 and 128, dynamic of every
projection per tensor, per channel and with reduce_range, static), transformers' export with and
without ONNX Runtime's optimizer, fp32 and int8, and each ``--onnx-graph`` file; one round of each
in turn. It reports sentences/s, the ratio to torch fp32, each engine's STS-B test
Spearman, its max abs difference from torch and the operators ONNX Runtime runs for its graph, and
breaks the time of the main graphs down by operator (ONNX Runtime's profiler).
``--search VECTORS.npy|random`` times the search indexes (``bertcf.search.index``: exact float32,
HNSW float32, int8 HNSW and binary, rescored or not) on the vectors of a .npy or on random unit
vectors: each one's build time, size in bytes, queries per second and recall@k against exact
search (:mod:`.search`).
Every mode measures what other processes took of the CPUs (:mod:`.load`): in an idle check before
anything is loaded (``--load-check`` seconds) and over the run; above 0.10 of a core either way it
refuses, in one line with exit status 2, before the run or before its table and JSON, unless
``--allow-busy``. The JSON keeps it in ``info.load``.
Inputs are random token ids with realistic variable lengths (a log-normal around each task's
typical length, clipped to its max length), [CLS] ... [SEP] and dynamic padding, fixed seed.
minBERT runs unpadded (the real tokens only; ``--no-unpad`` turns that off), transformers
padded, as each does in training. Time: median over --steps timed steps after --warmup untimed
ones (torch.cuda.synchronize around each step on a GPU). tokens/s counts real (non-padding) tokens. speed-up is
transformers' step time / minBERT's (> 1: minBERT is faster). On a GPU with a known peak,
MFU = model FLOPs / time / peak, with FLOPs = 6 N t (training) or 2 N t (inference) over the
real tokens t, N the non-embedding encoder parameters (plus heads / flow), plus attention
12 L d t^2 (training) or 4 L d t^2 (inference) per sentence; with peft's adapters, 4 N t for the
frozen weights (no weight gradients) plus the adapters' products (timing.adapted_encoder_flops).
Memory (each workload, one more step per implementation, untimed): the parameters trained, AdamW's
state, the weights, and the step's peak of tensor memory above its start (CUDA: max_memory_allocated;
CPU: torch.profiler's accounting of the CPU allocator; docs/benchmark.md says why not the RSS).

The modules: :mod:`.models` (the two implementations, same config and weights), :mod:`.batches`
(the random inputs), :mod:`.workloads` (the four workloads and stage 3's variants), :mod:`.timing` (alternating steps,
FLOPs, MFU, the memory, the profiler), :mod:`.onnx_encode` (``--onnx``), :mod:`.search` (``--search``),
:mod:`.load` (the load beside a run); the command line is :mod:`bertcf.commands.bench`
(``python -m bertcf.bench`` runs it). Importing this package imports
nothing else (no torch).
"""
