#!/usr/bin/env bash
# Issue 46, second call: the GPU-only tests, then the suite with each worker on 2 threads, every result named.
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p ../shared && tar -xJf .gpu/shared.tar.xz -C ../shared
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 - <<'PY'
import shutil
from safetensors.torch import load_file, save_file
shutil.copytree(".gpu/minilm-fp16", "/tmp/minilm", dirs_exist_ok=True)
sd = {k: v.float() if v.is_floating_point() else v for k, v in load_file(".gpu/minilm-fp16/model.safetensors").items()}
save_file(sd, "/tmp/minilm/model.safetensors", metadata={"format": "pt"})
PY
export BERTCF_REAL_BERT=/tmp/minilm
echo "=== [$SECONDS s] GPU-only tests"
timeout 60 python3 -m pytest -q -rfEs -p no:cacheprovider tests/minbert/test_minbert.py 2>&1 | tail -15
echo "=== [$SECONDS s] the suite, 8 workers x 2 threads"
timeout $(( ${BUDGET:-220} - SECONDS )) python3 -m pytest -v -n 8 --dist loadfile -rfE --tb=short -p no:cacheprovider \
  > "$OUT/suite2.log" 2>&1
echo "=== rc $? at $SECONDS s"
grep -E "(FAILED|ERROR) tests/" "$OUT/suite2.log" | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | sort -u | head -60
grep -cE " PASSED " "$OUT/suite2.log"
tail -60 "$OUT/suite2.log" | grep -v "^\[gw" | tail -50
