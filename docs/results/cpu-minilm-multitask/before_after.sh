#!/usr/bin/env bash
# The report's three tasks before the move into bertcf/multitask/ (main 421935b) and after (this
# checkout), on MiniLM, same seed and settings: are the weights and the dev metrics the same?
# Usage: MINILM_DIR=... before_after.sh OUT_DIR (run from the repository root).
set -euo pipefail
out=$1
MINILM_DIR=${MINILM_DIR:?set MINILM_DIR}
DATA=$(realpath "${DATA:-../shared/data/cs224n-offline}")  # absolute: the "before" side runs in its own checkout
mkdir -p "$out/before-src"
git archive 421935b | tar -x -C "$out/before-src"
flags=(--model "$MINILM_DIR" --data-dir "$DATA" --steps 40 --eval-every 20 --sst-batch-size 8 --qqp-batch-size 24
       --sts-batch-size 8 --max-length 64 --max-eval-examples 300 --device cpu --precision fp32)
for side in before after; do
  src=$([[ $side == before ]] && echo "$out/before-src" || pwd)
  [[ -f "$out/$side/metrics.json" ]] || (cd "$src" && /usr/bin/time -f "$side wall %e s" -a -o "$out/times.txt" \
    python run_multitask.py "${flags[@]}" --out-dir "$out/$side" > "$out/$side.log" 2>&1)
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
out = Path(sys.argv[1])
for name in ("model.safetensors", "heads.safetensors"):
    a, b = (load_file(str(out / side / "last" / name)) for side in ("before", "after"))
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    print(f"{name}: {len(a)} tensors, {'bit for bit equal' if same else 'DIFFERENT'}")
ma, mb = (json.loads((out / side / "metrics.json").read_text()) for side in ("before", "after"))
for key in ("sst_acc", "qqp_acc", "sts_pearson", "mean_dev"):
    print(f"{key}: before {ma[key]!r}, after {mb[key]!r}, {'equal' if ma[key] == mb[key] else 'DIFFERENT'}")
PY
