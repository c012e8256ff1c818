"""STS-B test of the ONNX graphs under four batchings (docs/BENCHMARKS.md, issues 60 and 69): each side
of the pairs encoded apart, then both sides in one encode at batches of 64, 16 and 128. Per-tensor
dynamic int8 quantises each batch's activations with that batch's range, so its score moves with the
batching; the goal is the int8 graph within 0.2 points of fp32 on the mean of the four.

    python docs/bench/onnx_int8_batching.py MINILM_DIR SENTEVAL_DIR SCRATCH_DIR [NAME=GRAPH.onnx ...]

Scores the export `bertcf-export onnx MINILM_DIR --quantize int8` writes (fp32 and int8), its fp32 graph
in blockwise int8 (MatMulNBits, the export's int8 before issue 69's switch), transformers' export
with ONNX Runtime's optimizer and per-tensor dynamic int8 (issue 60's fastest graph), and each
NAME=GRAPH.onnx given (an earlier export's int8 graph, say; run with the new export's tokenizer): the
four scores, their mean, the mean's difference from fp32, and how far each graph's vectors are from
the fp32 graph's (mean 1 - cos over STS-B test's sentences, batches of 64: less noisy than Spearman).

Accuracy only (the times are the bench's); issue 69, 1 thread beside other work, onnxruntime 1.32.0,
the new graph's int8 variants (the export's int8 was the first then; it is "Q/K/V in fp32" since):
    fp32                                  82.032 82.032 82.032 82.032  mean 82.032
    int8 (MatMulNBits 8 bits, blocks 32)  82.057 82.057 82.057 82.057  mean 82.057 (+0.025)  1-cos 4.1e-04
    int8 blocks of 128                    82.005 x4                    mean 82.005 (-0.027)  1-cos 1.2e-03
    (4 bits, blocks of 32                 82.313 x4                    mean 82.313 (+0.281)  1-cos 3.4e-02)
    int8 dynamic (per tensor)             81.830 81.965 81.718 81.788  mean 81.825 (-0.207)  1-cos 4.2e-02
    int8 dynamic per-channel              81.895 81.776 81.823 81.581  mean 81.769 (-0.263)  1-cos 7.7e-03
    int8 dynamic reduce_range             80.498 80.359 80.349 80.357  mean 80.391 (-1.641)
    int8 dynamic, Q/K/V in fp32           82.017 81.943 81.889 81.674  mean 81.881 (-0.151)
    int8 dynamic, attention output fp32   81.776 81.785 81.701 81.628  mean 81.722 (-0.310)
    int8 dynamic, FFN's first in fp32     81.821 81.755 81.803 81.718  mean 81.774 (-0.258)
    int8 dynamic, FFN's second in fp32    81.900 81.737 81.757 81.783  mean 81.794 (-0.238)
Issue 60's, for comparison (2-core Intel Xeon, alone): transformers + ORT optimizer int8 81.79 81.95
81.71 81.79 (mean -0.22); minBERT fused int8, attention in fp32 (issue 60's default) 82.04 81.94 81.89
81.69 (mean -0.14).
"""
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from bertcf import SentenceEncoder
from bertcf.backend.onnx_export import export_onnx, quantize
from bertcf.backend.onnx_runtime import OnnxEncoder
from bertcf.bench.onnx_variants import BLOCKWISE, DYNAMIC, optimize_transformers
from bertcf.data.senteval import read_stsb
from bertcf.evaluation.metrics import spearman

model, senteval, scratch = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
extra = dict(arg.split("=", 1) for arg in sys.argv[4:])
pairs = read_stsb(senteval / "STS" / "STSBenchmark" / "sts-test.csv")
gold = [p.label for p in pairs]
both = [s for p in pairs for s in (p.sentence1, p.sentence2)]


def stsb(u, v) -> float:
    cosines = (u * v).sum(1) / np.linalg.norm(u, axis=1) / np.linalg.norm(v, axis=1)
    return round(100 * spearman(torch.from_numpy(cosines), gold), 3)


def score(encoder) -> tuple[list[float], np.ndarray]:
    """The four batchings' scores and the vectors of both sides at batches of 64."""
    scores = [stsb(encoder.encode([p.sentence1 for p in pairs]).astype(np.float64),
                   encoder.encode([p.sentence2 for p in pairs]).astype(np.float64))]
    together = {batch: encoder.encode(both, batch_size=batch).astype(np.float64) for batch in (64, 16, 128)}
    return scores + [stsb(w[0::2], w[1::2]) for w in together.values()], together[64]


new = scratch / "export"
shutil.rmtree(new, ignore_errors=True)
export_onnx(model, new, "int8")
export_onnx(model, scratch / "transformers", None, graph="transformers")
optimize_transformers(scratch / "transformers" / "encoder.onnx", new / "transformers-optimized.onnx",
                      SentenceEncoder.from_pretrained(model).bert.config)
quantize(new / "transformers-optimized.onnx", new / "transformers-optimized-int8.onnx", **DYNAMIC)
quantize(new / "encoder.onnx", new / "encoder-blockwise.onnx", **BLOCKWISE)
graphs = {"fp32 (the export's)": "encoder.onnx", "int8 (the export's)": "encoder_qint8.onnx",
          "int8 blockwise": "encoder-blockwise.onnx",
          "transformers + ORT optimizer int8 dynamic": "transformers-optimized-int8.onnx"}
for name, path in extra.items():
    graphs[name] = f"extra-{len(graphs)}.onnx"
    shutil.copyfile(path, new / graphs[name])
reference = None
for name, graph in graphs.items():
    scores, vectors = score(OnnxEncoder(new, graph=graph))
    if reference is None:
        reference, fp32 = vectors, np.mean(scores)
    cos = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    print(f"{name}: {' '.join(f'{s:.3f}' for s in scores)}  mean {np.mean(scores):.3f} "
          f"({np.mean(scores) - fp32:+.3f} from fp32)  1-cos {1 - cos.mean():.1e}", flush=True)
