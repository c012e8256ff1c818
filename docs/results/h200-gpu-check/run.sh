#!/usr/bin/env bash
# Issue 46 on a lent GPU, in one call: the suite, the bench (bf16, against transformers, profiled),
# then each stage's training speed at the report's model size. Every piece is time-boxed.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
budget=${BUDGET:-500}
left() { echo $(( budget - SECONDS )); }
step() { local cap=$1; shift; local l; l=$(left); (( l > 20 )) || { echo "SKIPPED (time): $*"; return; }
  (( cap < l )) || cap=$l; echo "=== [$SECONDS s] $* (at most $cap s)"; timeout "$cap" "$@"; echo "=== rc $? at $SECONDS s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, sentence_transformers as st, onnxruntime as ort; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(), 'cap', torch.cuda.get_device_capability(), '| transformers', transformers.__version__, '| sentence-transformers', st.__version__, '| onnxruntime', ort.__version__)"
nproc
mkdir -p ../shared && tar -xJf .gpu/shared.tar.xz -C ../shared || echo "no ../shared"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
# The real MiniLM travels in half precision; the tests compare implementations in fp32.
python3 - <<'PY'
import os, shutil
from safetensors.torch import load_file, save_file
shutil.copytree(".gpu/minilm-fp16", "/tmp/minilm", dirs_exist_ok=True)
sd = {k: v.float() if v.is_floating_point() else v for k, v in load_file(".gpu/minilm-fp16/model.safetensors").items()}
save_file(sd, "/tmp/minilm/model.safetensors", metadata={"format": "pt"})
from transformers import BertConfig, BertModel
import torch; torch.manual_seed(0)
BertModel(BertConfig()).save_pretrained("/tmp/bert-base")   # bert-base's shape, random weights (no hub here)
shutil.copy(".gpu/minilm-fp16/vocab.txt", "/tmp/bert-base/vocab.txt")
PY
export BERTCF_REAL_BERT=/tmp/minilm
# 1. The suite, GPU-only tests included; then the failures once more, one process.
step 230 python3 -m pytest -q -n 8 --dist loadfile -r fEs -p no:cacheprovider --junitxml="$OUT/junit.xml" > "$OUT/suite.log" 2>&1
tail -30 "$OUT/suite.log"
grep -o "^FAILED [^ ]*" "$OUT/suite.log" | cut -d' ' -f2 | head -15 > /tmp/failed
[[ -s /tmp/failed ]] && step 60 python3 -m pytest -q -x -r fE $(cat /tmp/failed) 2>&1 | tail -40
# 2. The bench, bf16: MiniLM and bert-base's shape, every workload, minBERT against transformers; profiled.
step 70 python3 -m bertcf.bench --model /tmp/minilm --device cuda --json "$OUT/bench-minilm.json"
step 90 python3 -m bertcf.bench --model /tmp/bert-base --device cuda --profile 5 --json "$OUT/bench-base.json" > "$OUT/bench-base.log" 2>&1; grep -v "^\s*$" "$OUT/bench-base.log" | head -60
# 3. Each stage's speed at bert-base's shape (random weights), a short run each.
d=../shared/data/cs224n-offline
for s in mirror joint; do
  step 60 python3 run_pretrain.py --stage $s --model /tmp/bert-base --data-dir $d --corpus-from-tasks --steps 300 --eval-every 300 --select-on last --device cuda --progress lines --log-every 100 --out-dir /tmp/r-$s 2>&1 | tail -5
done
step 60 python3 run_multitask.py --model /tmp/bert-base --data-dir $d --steps 300 --eval-every 300 --device cuda --progress lines --out-dir /tmp/r-mt 2>&1 | tail -5
step 90 python3 -m bertcf.bench --model /tmp/bert-base --device cuda --compile --json "$OUT/bench-base-compile.json" 2>&1 | tail -25
echo "done at $SECONDS s"
