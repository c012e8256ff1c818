#!/usr/bin/env bash
# Serving and search at speed (issue 50), MiniLM on this CPU (2 threads throughout):
# 1. the ONNX table: MiniLM exported (fused attention, int8 too), every engine of bench --onnx;
# 2. the Quora set in BEIR's layout: exact float32, HNSW float32, int8 HNSW, binary with and without
#    rescoring, each through `python -m bertcf.evaluate --index`;
# 3. bench --search on Quora's corpus vectors (the last 1,000 held out as queries), then on 100,000 and
#    1,000,000 random unit vectors of 384 dimensions (build time, bytes, queries/s, recall@10);
# 4. mteb's STS-B through the adapter, against bertcf.evaluate's STSBenchmark.
# Usage: run.sh MINILM_DIR CS224N_DIR SENTEVAL_DIR OUT
set -euo pipefail
minilm=$1 data=$2 senteval=$3 out=$4
mkdir -p "$out"
timed() { local name=$1 t0; shift; t0=$(date +%s); "$@"; echo "$name: $(( $(date +%s) - t0 )) s" >> "$out/wall.txt"; }
done_() { [[ -f $1 ]]; }

# 1. ONNX.
done_ "$out/onnx/onnx_encoder.json" || timed export python -m bertcf.export onnx "$minilm" --out "$out/onnx" --quantize int8
done_ "$out/bench-onnx.json" || timed bench-onnx python -m bertcf.bench --onnx "$out/onnx" --senteval-dir "$senteval" \
  --threads 2 --json "$out/bench-onnx.json"

# 2. Quora through each index.
quora=$out/beir-quora
[[ -d $quora ]] || python -m bertcf.data beir-quora --data-dir "$data" --out "$quora"
for variant in exact hnsw int8 binary binary-no-rescore; do
  flags=(--index "${variant%-no-rescore}")
  [[ $variant == *-no-rescore ]] && flags+=(--no-rescore)
  done_ "$out/quora-$variant.json" || timed "quora-$variant" python -m bertcf.evaluate --encoder "$minilm" \
    --tasks retrieval --retrieval-dir "$quora" "${flags[@]}" --threads 2 --device cpu --no-progress \
    --json "$out/quora-$variant.json"
done

# 3. The indexes' speed and size: Quora's vectors, then random ones.
done_ "$out/quora-corpus.txt" || python -c "import json, sys
with open(sys.argv[2], 'w') as out:
    for line in open(sys.argv[1]):
        out.write(' '.join(json.loads(line)['text'].split()) + '\n')" "$quora/corpus.jsonl" "$out/quora-corpus.txt"
done_ "$out/quora-vectors.npy" || timed encode-quora python -m bertcf.encode --model "$minilm" --input "$out/quora-corpus.txt" \
  --output "$out/quora-vectors.npy" --device cpu --progress none
done_ "$out/bench-search-quora.json" || timed bench-search-quora python -m bertcf.bench --search "$out/quora-vectors.npy" \
  --search-queries 1000 --threads 2 --json "$out/bench-search-quora.json"
# 4. mteb's STS-B and ours.
done_ "$out/stsb.json" || timed stsb python -m bertcf.evaluate --encoder "$minilm" --senteval-dir "$senteval" \
  --tasks STSBenchmark,mteb-sts --threads 2 --device cpu --no-progress --json "$out/stsb.json"

# 3. (continued) The random sets last: the 1,000,000 takes longest.
for n in 100000 1000000; do
  done_ "$out/bench-search-$n.json" || timed "bench-search-$n" python -m bertcf.bench --search random --search-n "$n" \
    --search-queries 1000 --threads 2 --json "$out/bench-search-$n.json"
done
