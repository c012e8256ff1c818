#!/usr/bin/env bash
# Issue 69, measured alone: minBERT's ONNX graph as ONNX Runtime fuses it (MultiHeadAttention, Gelu,
# LayerNormalization on [tokens, D]; int8 dynamic, the Q/K/V projections in float) against issue 60's
# default graphs and transformers' export with ONNX Runtime's optimizer: the bench's --onnx table
# (every variant, the operators ONNX Runtime runs for each), its per-operator profile, and the
# four-batching STS-B check.
#
#   docs/bench/onnx_fusion.sh MINILM_DIR SENTEVAL_DIR [SCRATCH_DIR]
#
# Run it with nothing else on the machine (the bench refuses when other work takes over 0.1 of a core).
# About 11 minutes on the 2-core dev machine: the old export 0.5, the bench 7-8 (its graphs 2, six
# rounds of 19 engines 5, the profiles 0.5), the batching check 2. Writes docs/bench/cpu-minilm-onnx-fusion.json.
set -euo pipefail
MINILM=$(realpath "${1:?MINILM_DIR}")
SENTEVAL=$(realpath "${2:?SENTEVAL_DIR}")
SCRATCH=$(realpath "${3:-$(mktemp -d -t bertcf-onnx-fusion-XXXX)}")
BEFORE_COMMIT=${BEFORE_COMMIT:-49724d9}  # the last commit before issue 69: issue 60's graphs
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OLD_INT8="issue 60 default int8 (attention in fp32)"

# Issue 60's graphs, written by that commit's code (an archive of it: no git state changes).
rm -rf "$SCRATCH/before" "$SCRATCH/old" "$SCRATCH/new"
mkdir -p "$SCRATCH/before"
git -C "$REPO" archive "$BEFORE_COMMIT" | tar -x -C "$SCRATCH/before"
(cd "$SCRATCH/before" && python -m bertcf.export onnx "$MINILM" --out "$SCRATCH/old" --quantize int8 --graph minbert)

cd "$REPO"
python -m bertcf.export onnx "$MINILM" --out "$SCRATCH/new" --quantize int8
python -m bertcf.bench --onnx "$SCRATCH/new" --senteval-dir "$SENTEVAL" --threads 2 --steps 5 --warmup 1 \
    --onnx-graph "issue 60 minBERT fused fp32 (Attention)=$SCRATCH/old/encoder.onnx" \
    --onnx-graph "$OLD_INT8=$SCRATCH/old/encoder_qint8.onnx" \
    --json docs/bench/cpu-minilm-onnx-fusion.json
python docs/bench/onnx_int8_batching.py "$MINILM" "$SENTEVAL" "$SCRATCH/batching" \
    "$OLD_INT8=$SCRATCH/old/encoder_qint8.onnx"
