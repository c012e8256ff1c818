"""STS-B test of the int8 graphs under four batchings (docs/BENCHMARKS.md, issue 60): each side of the
pairs encoded apart, then both sides in one encode at batches of 64, 16 and 128. Dynamic int8
quantises each batch's activations with that batch's range, so the score moves with the batching.

    python docs/bench/onnx_int8_batching.py MINILM_DIR ../shared/data/senteval SCRATCH_DIR

Output of the run recorded in BENCHMARKS.md (2-core Intel Xeon, onnxruntime 1.32.0, ~2 minutes):
    transformers int8 {'separate': 81.785, 'together': 81.986, 'together bs16': 81.707, 'together bs128': 81.755}
    transformers + ORT optimizer int8 {'separate': 81.793, 'together': 81.954, 'together bs16': 81.712, 'together bs128': 81.791}
    minBERT fused int8, attention in fp32 {'separate': 82.038, 'together': 81.936, 'together bs16': 81.888, 'together bs128': 81.688}
"""
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from bertcf import SentenceEncoder
from bertcf.backend.onnx_export import INT8_OPTIONS, export_onnx, quantize
from bertcf.backend.onnx_runtime import OnnxEncoder
from bertcf.bench.onnx_variants import optimize_transformers
from bertcf.data.senteval import read_stsb
from bertcf.evaluation.metrics import spearman

model, senteval, scratch = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
pairs = read_stsb(senteval / "STS" / "STSBenchmark" / "sts-test.csv")
gold = [p.label for p in pairs]


def stsb(u, v) -> float:
    cosines = (u * v).sum(1) / np.linalg.norm(u, axis=1) / np.linalg.norm(v, axis=1)
    return round(100 * spearman(torch.from_numpy(cosines), gold), 3)


def score(encoder) -> dict:
    out = {"separate": stsb(encoder.encode([p.sentence1 for p in pairs]).astype(np.float64),
                            encoder.encode([p.sentence2 for p in pairs]).astype(np.float64))}
    both = [s for p in pairs for s in (p.sentence1, p.sentence2)]
    for batch, name in ((64, "together"), (16, "together bs16"), (128, "together bs128")):
        w = encoder.encode(both, batch_size=batch).astype(np.float64)
        out[name] = stsb(w[0::2], w[1::2])
    return out


hf, mb = scratch / "transformers", scratch / "minbert"
for d in (hf, mb):
    shutil.rmtree(d, ignore_errors=True)
export_onnx(model, hf, None, graph="transformers")
optimize_transformers(hf / "encoder.onnx", hf / "optimized.onnx", SentenceEncoder.from_pretrained(model).bert.config)
quantize(hf / "encoder.onnx", hf / "int8.onnx", **INT8_OPTIONS)
quantize(hf / "optimized.onnx", hf / "optimized-int8.onnx", **INT8_OPTIONS)
print("transformers int8", score(OnnxEncoder(hf, graph="int8.onnx")))
print("transformers + ORT optimizer int8", score(OnnxEncoder(hf, graph="optimized-int8.onnx")))
export_onnx(model, mb, "int8", graph="minbert")
print("minBERT fused int8, attention in fp32", score(OnnxEncoder(mb, quantized=True)))
