"""Benchmark minBERT against ``transformers.BertModel`` (sdpa attention) on this project's workloads.

    python -m bertcf.bench --model NAME_OR_DIR --device cpu|cuda [--precision bf16|fp16|fp32]
                           [--steps N] [--warmup N] [--workloads mirror,joint,multitask,encode] [--json OUT]
    python -m bertcf.bench --onnx EXPORT_DIR --senteval-dir DIR [--threads N] [--steps N] [--warmup N]

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
             0.1 + linear D x 768), MultitaskLoss (5 / 20 / 1), backward, AdamW step.
  encode     inference throughput: --encode-sentences sentences, length-sorted batches of 64,
             eval mode under torch.inference_mode.
``--onnx EXPORT_DIR`` times something else, on the CPU: ``encode()`` of STS-B test's 2,758
sentences (length-sorted batches of 64) by the exported checkpoint under torch fp32, and by the
export under ONNX Runtime fp32 and int8 (``bertcf.onnx.OnnxEncoder``), one round of each in turn;
it reports sentences/s, the ratio to torch fp32, each engine's STS-B test Spearman and its max
abs difference from torch.
Inputs are random token ids with realistic variable lengths (a log-normal around each task's
typical length, clipped to its max length), [CLS] ... [SEP] and dynamic padding, fixed seed.
minBERT runs unpadded (the real tokens only; ``--no-unpad`` turns that off), transformers
padded, as each does in training. Time: median over --steps timed steps after --warmup untimed
ones (torch.cuda.synchronize around each step on a GPU). tokens/s counts real (non-padding) tokens. speed-up is
transformers' step time / minBERT's (> 1: minBERT is faster). On a GPU with a known peak,
MFU = model FLOPs / time / peak, with FLOPs = 6 N t (training) or 2 N t (inference) over the
real tokens t, N the non-embedding encoder parameters (plus heads / flow), plus attention
12 L d t^2 (training) or 4 L d t^2 (inference) per sentence.
"""
from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from .utils import environment

WORKLOADS = ("mirror", "joint", "multitask", "encode")

#: --tiny: small enough for a test on a laptop CPU.
TINY_CONFIG = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, max_position_embeddings=512)

#: Hub names whose config is known, so the bench runs offline with random weights.
KNOWN_CONFIGS = {
    "bert-base-uncased": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "bert-base-cased": dict(vocab_size=28996, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072),
    "bert-large-uncased": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                               intermediate_size=4096),
}

#: Dense tensor-core peak (TFLOP/s) in bf16/fp16 by device name; MFU is omitted elsewhere.
PEAK_TFLOPS_16BIT = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
                     ("A100", 312.0))

#: Sentence lengths in tokens (with [CLS]/[SEP]) per workload: (median, max length).
LENGTHS = {"mirror": (24, 32), "sst": (26, 128), "qqp": (15, 128), "sts": (14, 128), "encode": (14, 128)}


# ---- models -------------------------------------------------------------------------------------
def load_models(model: str | None, tiny: bool = False, seed: int = 11711):
    """(minBERT, transformers.BertModel with sdpa attention, note): identical config and weights."""
    import transformers

    from minbert import BertConfig, BertModel, CheckpointError
    from minbert.model import has_weights

    torch.manual_seed(seed)
    note = ""
    if tiny:
        mb, note = BertModel(BertConfig(**TINY_CONFIG)), "tiny config, random weights"
    else:
        path = Path(model)
        config_file = path if path.is_file() else path / "config.json"
        if path.is_dir() and has_weights(path):
            mb, note = BertModel.from_pretrained(path), "checkpoint weights"
        elif config_file.is_file():
            mb, note = BertModel(BertConfig.from_json_file(config_file)), "config only, random weights"
        else:
            try:
                mb, note = BertModel.from_pretrained(model), "checkpoint weights"
            except CheckpointError as e:
                if model not in KNOWN_CONFIGS:
                    raise
                mb = BertModel(BertConfig(**KNOWN_CONFIGS[model]))
                note = f"{model} not available offline ({e}); its config with random weights"
    hf_config = transformers.BertConfig.from_dict(mb.config.to_dict())
    hf_config._attn_implementation = "sdpa"
    hf = transformers.BertModel(hf_config, add_pooling_layer=True)
    hf.load_state_dict(mb.state_dict(), strict=True)
    return mb, hf, note


class Encoder(nn.Module):
    """Either implementation behind minBERT's call, ``(input_ids, attention_mask,
    token_type_ids=None, num_tokens=None) -> {'last_hidden_state': [b, t, D]}``, so that every
    workload (and :class:`bertcf.models.multitask.MultitaskModel`) runs the same code on both.

    ``compile_``: minBERT compiles layer by layer (:meth:`minbert.BertModel.compile`),
    transformers as a whole model, both with ``dynamic=True`` (the batch shapes change from
    step to step). ``unpad=False`` makes minBERT compute the padding too, as transformers does."""

    def __init__(self, model, compile_: bool = False, unpad: bool = True):
        super().__init__()
        self.is_minbert = model.__class__.__module__.startswith("minbert")
        self.config, self.unpad = model.config, unpad
        if compile_ and self.is_minbert:
            model.compile_layers()
        self.call = torch.compile(model, dynamic=True) if compile_ and not self.is_minbert else model

    def forward(self, input_ids, attention_mask, token_type_ids=None, num_tokens=None):
        if self.is_minbert:
            return self.call(input_ids, attention_mask, token_type_ids, num_tokens=num_tokens, unpad=self.unpad)
        out = self.call(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return {"last_hidden_state": out.last_hidden_state}


# ---- inputs -------------------------------------------------------------------------------------
@dataclass
class Batch:
    ids: torch.Tensor
    mask: torch.Tensor
    lengths: list = field(default_factory=list)
    special: torch.Tensor | None = None  # [CLS]/[SEP]/padding, for a pretraining objective

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def hidden(self, bert):
        """The last hidden state [b, t, D] of an :class:`Encoder`."""
        return bert(self.ids, self.mask, num_tokens=self.tokens)["last_hidden_state"]


def sample_lengths(n: int, median: int, max_len: int, g: torch.Generator) -> list[int]:
    lengths = torch.exp(math.log(median) + 0.45 * torch.randn(n, generator=g)).round().long()
    return lengths.clamp(4, max_len).tolist()


def make_batch(lengths, vocab_size: int, g: torch.Generator, device, special=(101, 102)) -> Batch:
    """[CLS] w1 .. wn [SEP] + padding to the longest (dynamic padding)."""
    cls_id, sep_id = special
    t = max(lengths)
    low = 1000 if vocab_size > 2000 else 5  # skip [PAD], [unused..], [CLS], [SEP], [MASK]
    ids = torch.randint(low, vocab_size, (len(lengths), t), generator=g)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, 0], ids[i, n - 1] = cls_id, sep_id
    ids = ids * mask
    return Batch(ids.to(device), mask.to(device), list(lengths))


def special_ids(vocab_size: int):
    """([CLS], [SEP], [MASK]) of the uncased vocabulary, or of the test vocabulary when small."""
    return (101, 102, 103) if vocab_size > 2000 else (2, 3, 4)


# ---- FLOPs and peaks --------------------------------------------------------------------------
def encoder_flops(config, lengths, training: bool) -> float:
    """Model FLOPs of the encoder over sentences of these real lengths (no padding counted)."""
    d, L, i = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    n_layer = L * (4 * d * d + 2 * d * i)  # matmul weights per token (biases/LayerNorm negligible)
    per_token, attention = (6, 12) if training else (2, 4)
    return sum(per_token * n_layer * t + attention * L * d * t * t for t in lengths)


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense bf16/fp16 peak in FLOP/s, or None (CPU, fp32, unknown GPU)."""
    if device.type != "cuda" or precision not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS_16BIT:
        if key in name:
            return tflops * 1e12
    return None


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's with the threads torch runs on."""
    name = environment.device_name(device) or "unknown device"
    return name if device.type == "cuda" else f"{name} ({torch.get_num_threads()} threads)"


# ---- workloads ----------------------------------------------------------------------------------
class Workload:
    """Inputs shared by both models, and per model a ``step()`` closure plus per-step counts."""

    training = True

    def __init__(self, name, config, device, precision, n_batches, seed):
        self.name, self.config, self.device, self.precision = name, config, torch.device(device), precision
        self.g = torch.Generator().manual_seed(seed)
        self.cls, self.sep, self.mask_id = special_ids(config.vocab_size)
        self.batches = self.make_inputs(n_batches)

    def batch(self, n, kind):
        median, max_len = LENGTHS[kind]
        max_len = min(max_len, self.config.max_position_embeddings)
        return make_batch(sample_lengths(n, median, max_len, self.g), self.config.vocab_size, self.g, self.device,
                          (self.cls, self.sep))

    def autocast(self):
        from .utils.precision import autocast
        return autocast(self.device, self.precision)

    def training_step(self, params, lr, loss_fn):
        """A step closure: ``loss_fn(inputs)`` through ``training.update`` (autocast, scaled
        backward) with AdamW (fused, weight decay 0.01) over ``params`` (or parameter groups)."""
        from .training.optim import make_optimizer, update

        opt = make_optimizer(params, lr, 0.01, self.device)
        scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")

        def step(inputs):
            return update(opt, scaler, lambda: (loss_fn(inputs), {}), self.device, self.precision)[0]
        return step

    # per-step figures, averaged over the input pool
    def sentences(self, inputs) -> int:
        return sum(len(b.lengths) for b in inputs)

    def real_tokens(self, inputs) -> int:
        return sum(b.tokens for b in inputs)

    def flops(self, inputs) -> float:
        return sum(encoder_flops(self.config, b.lengths, self.training) for b in inputs)


class Mirror(Workload):
    """Pretraining's own objective (``bertcf.objectives``) on batches of 16 corpus sentences on the
    host, as pretraining hands them over: it draws the views, copies them to the device, encodes."""

    stage = "mirror"

    def make_inputs(self, n):
        inputs = []
        for _ in range(n):
            b = self.batch(16, "mirror")
            b.ids, b.mask = b.ids.cpu(), b.mask.cpu()
            b.special = (b.ids == self.cls) | (b.ids == self.sep) | (b.mask == 0)
            inputs.append([b])
        return inputs

    def build(self, bert):
        from types import SimpleNamespace

        from .models.encoder import SentenceEncoder
        from .objectives import build_objective
        from .pretrain import STAGE_LR

        bert.requires_grad_(True)  # a joint workload before may have frozen it
        torch.manual_seed(0)  # the same initial flow for both implementations
        tokenizer = SimpleNamespace(mask_token_id=self.mask_id, pad_token_id=0)
        objective = build_objective(self.stage, "mirror", SentenceEncoder(bert, tokenizer), None,
                                    torch.Generator().manual_seed(0)).to(self.device).train()

        def loss(inputs):
            (b,) = inputs
            return objective(b.ids, b.mask, b.special)[0]
        return self.training_step(objective.parameter_groups(), STAGE_LR[self.stage], loss)

    # The encoder sees two views of each sentence.
    def sentences(self, inputs) -> int:
        return 2 * super().sentences(inputs)

    def real_tokens(self, inputs) -> int:
        return 2 * super().real_tokens(inputs)

    def flops(self, inputs):
        return sum(encoder_flops(self.config, b.lengths * 2, self.training) for b in inputs)


class Joint(Mirror):
    """BERT-CF's objective: the frozen encoder (forward only, dropout on as in the stage) and the flow."""

    stage = "joint"
    training = False  # the encoder only runs forward; the flow's FLOPs are added below

    def flops(self, inputs):
        d = self.config.hidden_size
        flow_qqpms = 3 * (d * d + (d // 2) * d + d * (d - d // 2))  # 1x1 + coupling MLP, roughly
        return super().flops(inputs) + sum(6 * flow_qqpms * 2 * len(b.lengths) for b in inputs)


class Multitask(Workload):
    """bertcf.multitask's training step itself: MultitaskModel (one encoder pass over all 288
    sentences, the heads) and MultitaskLoss, around either implementation."""

    sizes = {"sst": 32, "qqp": 96, "sts": 32}

    def make_inputs(self, n):
        out = []
        for _ in range(n):
            lengths = []
            for task, size in self.sizes.items():
                median, max_len = LENGTHS[task]
                rows = size * (1 if task == "sst" else 2)
                lengths += sample_lengths(rows, median, min(max_len, self.config.max_position_embeddings), self.g)
            out.append([make_batch(lengths, self.config.vocab_size, self.g, self.device, (self.cls, self.sep))])
        return out

    def build(self, bert):
        from .models.encoder import SentenceEncoder
        from .models.multitask import MultitaskLoss, MultitaskModel

        torch.manual_seed(0)  # the same initial heads for both implementations
        model = MultitaskModel(SentenceEncoder(bert, tokenizer=None), proj_dim=768, sst_dropout=0.3,
                               qqp_dropout=0.0, sts_dropout=0.1).to(self.device)
        model.requires_grad_(True)
        model.train()
        g = torch.Generator(device=self.device).manual_seed(0)
        labels = {"sst": torch.randint(0, 5, (32,), generator=g, device=self.device),
                  "qqp": torch.randint(0, 2, (96,), generator=g, device=self.device).float(),
                  "sts": torch.rand(32, generator=g, device=self.device) * 5}
        multitask_loss = MultitaskLoss({"sst": 5.0, "qqp": 20.0, "sts": 1.0}, qqp_margin=0.7, sts_margin=0.0)

        def loss(inputs):
            (b,) = inputs
            out = model(b.ids, b.mask, self.sizes, num_tokens=b.tokens)
            return multitask_loss(out, labels)[0]
        return self.training_step(model.parameters(), 1e-5, loss)

    def flops(self, inputs):
        d = self.config.hidden_size
        heads = 6 * d * (5 * self.sizes["sst"] + 768 * 2 * (self.sizes["qqp"] + self.sizes["sts"]))
        return super().flops(inputs) + heads


class Encode(Workload):
    training = False

    def __init__(self, *args, sentences=256, batch_size=64, **kwargs):
        self.n_sentences, self.batch_size = sentences, batch_size
        super().__init__(*args, **kwargs)

    def make_inputs(self, n):
        """One input = one encode() call: the sentences sorted by length, in batches of 64."""
        out = []
        for _ in range(n):
            median, max_len = LENGTHS["encode"]
            lengths = sorted(sample_lengths(self.n_sentences, median, min(max_len, self.config.max_position_embeddings),
                                            self.g), reverse=True)
            out.append([make_batch(lengths[i:i + self.batch_size], self.config.vocab_size, self.g, self.device,
                                   (self.cls, self.sep)) for i in range(0, len(lengths), self.batch_size)])
        return out

    def build(self, bert):
        from .models.encoder import pool

        bert.eval()

        @torch.inference_mode()
        def step(inputs):
            out = None
            for b in inputs:
                with self.autocast():
                    out = pool(b.hidden(bert), b.mask)
            return out
        return step


WORKLOAD_CLASSES = {"mirror": Mirror, "joint": Joint, "multitask": Multitask, "encode": Encode}


# ---- timing -------------------------------------------------------------------------------------
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_step(step, inputs_list, device) -> dict:
    """``torch.profiler`` over one ``step`` per input: the operator table (by GPU time on a GPU,
    else by CPU time) and the GPU kernels launched per step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with profile(activities=activities) as prof:
        for inputs in inputs_list:
            step(inputs)
        _sync(device)
    averages = prof.key_averages()
    table = averages.table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=20,
                           max_name_column_width=60)
    kernels = sum(e.count for e in averages if e.device_type == DeviceType.CUDA) / len(inputs_list)
    return {"steps": len(inputs_list), "table": table, "gpu_kernels_per_step": kernels if cuda else None}


def time_workload(workload: Workload, encoders: dict, steps: int, warmup: int, profile: int = 0) -> dict:
    """Median step time of each :class:`Encoder`; their steps alternate (order flipped every round)."""
    steps_fns = {name: workload.build(bert) for name, bert in encoders.items()}
    times = {name: [] for name in encoders}
    pool = workload.batches
    names = list(encoders)
    device = workload.device
    for i in range(warmup + steps):
        inputs = pool[i % len(pool)]
        for name in (names if i % 2 == 0 else names[::-1]):
            _sync(device)
            start = time.perf_counter()
            steps_fns[name](inputs)
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    timed_inputs = [pool[i % len(pool)] for i in range(warmup, warmup + steps)]
    per_step = {"sentences": statistics.mean(workload.sentences(x) for x in timed_inputs),
                "tokens": statistics.mean(workload.real_tokens(x) for x in timed_inputs),
                "flops": statistics.mean(workload.flops(x) for x in timed_inputs)}
    peak = peak_flops(device, workload.precision)
    result = {"per_step": per_step}
    for name, ts in times.items():
        median = statistics.median(ts)
        result[name] = {"ms_per_step": 1e3 * median, "tokens_per_s": per_step["tokens"] / median,
                        "sentences_per_s": per_step["sentences"] / median,
                        "tflops": per_step["flops"] / median / 1e12,
                        "mfu": per_step["flops"] / median / peak if peak else None,
                        "times_ms": [1e3 * t for t in ts]}
    if len(names) == 2:
        result["speedup"] = result[names[1]]["ms_per_step"] / result[names[0]]["ms_per_step"]
    if profile:
        result["profile"] = profile_step(steps_fns[names[0]], [pool[i % len(pool)] for i in range(profile)], device)
    return result


# ---- encode under ONNX Runtime (--onnx) -----------------------------------------------------------
def stsb_test_sentences(senteval_dir) -> tuple[list[str], list]:
    """STS-B test's sentences, both of every pair in file order (duplicates kept: 2 x 1,379), and its pairs."""
    from .data.senteval import read_stsb
    from .errors import DataError

    path = Path(senteval_dir) / "STS" / "STSBenchmark" / "sts-test.csv"
    if not path.is_file():
        raise DataError(f"--onnx times STS-B test's sentences: {path} not found (give --senteval-dir)")
    pairs = read_stsb(path)
    return [s for p in pairs for s in (p.sentence1, p.sentence2)], pairs


def onnx_engines(export_dir, threads: int | None) -> dict:
    """torch fp32 (SentenceEncoder on the exported checkpoint, on the CPU), ONNX Runtime fp32 and,
    when the export has it, int8 (OnnxEncoder, CPU execution provider)."""
    from minbert import CheckpointError

    from .models.encoder import SentenceEncoder
    from .onnx import OnnxEncoder, OnnxModelError

    try:
        fp32 = OnnxEncoder(export_dir, threads=threads, providers=["CPUExecutionProvider"])
        int8 = (OnnxEncoder(export_dir, quantized=True, threads=threads, providers=["CPUExecutionProvider"])
                if "int8" in fp32.config["graphs"] else None)
    except OnnxModelError as e:
        raise CheckpointError(str(e)) from None
    torch_encoder = SentenceEncoder.from_pretrained(fp32.config["source"]).eval()
    torch_encoder.precision = "fp32"
    engines = {"torch fp32": torch_encoder, "onnxruntime fp32": fp32}
    return engines | ({"onnxruntime int8": int8} if int8 is not None else {})


def time_onnx_encode(engines: dict, sentences: list[str], pairs: list, steps: int, warmup: int,
                     batch_size: int = 64) -> dict:
    """Each engine's ``encode(sentences, batch_size)`` (tokenisation, length-sorted batches, rows
    in input order), engines alternating, order flipped every round; the median round. With each
    engine's STS-B test Spearman x 100 and its max abs difference from torch fp32."""
    import numpy as np

    from .evaluation.metrics import spearman

    names, times, vectors = list(engines), {name: [] for name in engines}, {}
    for i in range(warmup + steps):
        for name in (names if i % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            out = engines[name].encode(sentences, batch_size=batch_size)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
            vectors[name] = np.asarray(out, dtype=np.float64)
    results = {}
    for name in names:
        v = vectors[name]
        u, w = v[0::2], v[1::2]
        cosines = (u * w).sum(1) / np.maximum(np.linalg.norm(u, axis=1) * np.linalg.norm(w, axis=1), 1e-12)
        median = statistics.median(times[name])
        results[name] = {"seconds": median, "sentences_per_s": len(sentences) / median,
                         "vs_torch_fp32": statistics.median(times[names[0]]) / median,
                         "stsb_test_spearman": 100 * spearman(torch.from_numpy(cosines), [p.label for p in pairs]),
                         "max_abs_diff_vs_torch": float(np.abs(v - vectors[names[0]]).max()),
                         "times_s": times[name]}
    return results


def onnx_main(args) -> dict:
    """``--onnx DIR``: the encode comparison of torch fp32, ONNX Runtime fp32 and int8, in one run."""
    import onnxruntime

    sentences, pairs = stsb_test_sentences(args.senteval_dir)
    engines = onnx_engines(args.onnx, args.threads)
    info = {"export": str(args.onnx), "model": engines["onnxruntime fp32"].config["source"],
            "device": device_name(torch.device("cpu")), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "python": platform.python_version(), "threads": args.threads,
            "sentences": len(sentences), "batch_size": 64, "steps": args.steps, "warmup": args.warmup}
    print(f"bench --onnx: {info['model']} and its export {info['export']}; STS-B test, {len(sentences)} sentences, "
          f"length-sorted batches of 64; median of {args.steps} rounds after {args.warmup}, engines alternating")
    print(f"device: {info['device']}; torch {torch.__version__}, onnxruntime {onnxruntime.__version__}", flush=True)
    results = time_onnx_encode(engines, sentences, pairs, args.steps, args.warmup)
    print("\n| engine | sentences/s | x torch fp32 | STS-B test Spearman x100 | max abs diff vs torch |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['sentences_per_s']:,.0f} | {r['vs_torch_fp32']:.2f}x | {r['stsb_test_spearman']:.2f} | "
              f"{r['max_abs_diff_vs_torch']:.1e} |")
    out = {"info": info, "results": {"onnx_encode": results}}
    if args.json:
        from .utils.files import write_json_atomic
        write_json_atomic(args.json, out)
        print(f"results written to {args.json}")
    return out


# ---- command line -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from .cli import AT_LEAST_0, AT_LEAST_1, ArgumentParser

    p = ArgumentParser(prog="python -m bertcf.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert-base-uncased",
                   help="checkpoint directory, directory or file with a config.json, or hub name")
    p.add_argument("--tiny", action="store_true", help="a 2-layer hidden-32 random model (for tests)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default=None,
                   help="autocast precision (default: bf16 on a GPU that supports it, else fp32)")
    p.add_argument("--steps", type=AT_LEAST_1, default=20,
                   help="timed steps per model and workload")
    p.add_argument("--warmup", type=AT_LEAST_0, default=3, help="untimed steps first")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="the workloads to time, comma-separated")
    p.add_argument("--encode-sentences", type=AT_LEAST_1, default=256,
                   help="sentences per encode step")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile both models (minBERT layer by layer, transformers whole; dynamic shapes)")
    p.add_argument("--no-unpad", action="store_true",
                   help="minBERT computes the padding too, as transformers does (shows what unpadding gains)")
    p.add_argument("--profile", type=AT_LEAST_0, default=0, metavar="N",
                   help="after timing, profile N of minBERT's steps of each workload (torch.profiler) and print "
                        "the operator table (0: off)")
    p.add_argument("--threads", type=AT_LEAST_1, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--seed", type=int, default=11711,
                   help="seed of the random inputs, and of the weights where they are random")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--onnx", default=None, metavar="EXPORT_DIR",
                   help="instead of the workloads: time encode() on STS-B test with torch fp32, ONNX Runtime fp32 and "
                        "int8, on the CPU, for this directory written by bertcf-export onnx (with --quantize int8)")
    p.add_argument("--senteval-dir", default="data/SentEval", help="--onnx: SentEval's data, for STS-B test")
    return p


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main(argv=None) -> dict:
    import transformers

    from .errors import UsageError
    from .utils.precision import resolve_device, resolve_precision

    args = build_parser().parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        raise UsageError(f"--workloads: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(WORKLOADS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.onnx:
        return onnx_main(args)
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    wall = time.perf_counter()
    mb, hf, note = load_models(args.model, args.tiny, args.seed)
    encoders = {"minbert": Encoder(mb.to(device), args.compile, unpad=not args.no_unpad),
                "transformers": Encoder(hf.to(device), args.compile)}
    config = mb.config
    info = {"model": "tiny" if args.tiny else args.model, "weights": note, "device": device_name(device),
            "precision": precision, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "steps": args.steps, "warmup": args.warmup,
            "compile": args.compile, "unpad": not args.no_unpad, "config": {k: getattr(config, k) for k in
                                                ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                 "intermediate_size", "vocab_size")},
            "encoder_params": sum(p.numel() for p in mb.parameters())}
    print(f"bench: {info['model']} ({note}); hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
          f"{info['encoder_params'] / 1e6:.1f}M parameters")
    print(f"device: {info['device']}; precision {precision}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, python {info['python']}")
    print(f"timing: median of {args.steps} steps after {args.warmup} warm-up steps, minBERT and transformers "
          f"alternating", flush=True)
    results = {}
    n_batches = max(1, min(args.steps + args.warmup, 8))
    for i, name in enumerate(workloads):
        kwargs = {"sentences": args.encode_sentences} if name == "encode" else {}
        workload = WORKLOAD_CLASSES[name](name, config, device, precision, n_batches, args.seed + i, **kwargs)
        start = time.perf_counter()
        results[name] = r = time_workload(workload, encoders, args.steps, args.warmup, args.profile)
        r["wall_s"] = time.perf_counter() - start
        if args.profile:
            kernels = r["profile"]["gpu_kernels_per_step"]
            print(f"{name} minBERT, torch.profiler over {args.profile} steps"
                  + (f" ({kernels:.0f} GPU kernels a step)" if kernels else "") + ":\n" + r["profile"]["table"])
        for impl in ("minbert", "transformers"):
            x = r[impl]
            print(f"{name:9s} {impl:12s} {x['ms_per_step']:10.2f} ms/step {x['tokens_per_s']:12,.0f} tokens/s "
                  f"{x['sentences_per_s']:10,.1f} sentences/s" + (f"  MFU {100 * x['mfu']:.1f}%" if x["mfu"] else ""))
        print(f"{name:9s} speed-up minBERT/transformers: {r['speedup']:.3f}x "
              f"({'minBERT faster' if r['speedup'] >= 1 else 'minBERT slower'})", flush=True)
    info["wall_s"] = time.perf_counter() - wall

    # The tidy table.
    print()
    head = "| workload | per step | minBERT ms | transformers ms | minBERT tokens/s | transformers tokens/s | speed-up |"
    mfu_cols = any(results[w]["minbert"]["mfu"] for w in results)
    if mfu_cols:
        head += " minBERT MFU | transformers MFU |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, r in results.items():
        ps = r["per_step"]
        row = (f"| {name} | {ps['sentences']:.0f} sent, {ps['tokens']:.0f} tok | {r['minbert']['ms_per_step']:.2f} | "
               f"{r['transformers']['ms_per_step']:.2f} | {r['minbert']['tokens_per_s']:,.0f} | "
               f"{r['transformers']['tokens_per_s']:,.0f} | {r['speedup']:.3f}x |")
        if mfu_cols:
            row += (f" {fmt(r['minbert']['mfu'] and 100 * r['minbert']['mfu'], '.1f')}% |"
                    f" {fmt(r['transformers']['mfu'] and 100 * r['transformers']['mfu'], '.1f')}% |")
        print(row)
    print(f"\nwall time {info['wall_s']:.1f} s")
    out = {"info": info, "results": results}
    if args.json:
        from .utils.files import write_json_atomic
        write_json_atomic(args.json, out)
        print(f"results written to {args.json}")
    return out


def cli(argv=None) -> int:
    from minbert import CheckpointError

    from .errors import DataError, UsageError
    try:
        main(argv)
        return 0
    except (UsageError, CheckpointError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
