#!/usr/bin/env bash
# Issue 70, item 3, in the call after run.sh: the whole suite on the lent GPU, time-boxed, every result named.
# Carried: .gpu (../shared/tools/pack-for-gpu.sh .gpu, plus the rest of ../shared and MiniLM's
# sentence-transformers files, which that script leaves out:
#   tar -cJf .gpu/shared.tar.xz -C ../shared --exclude=data/cs224n-offline --exclude=tools .
#   tar -cJf .gpu/minilm-st.tar.xz -C MINILM_DIR modules.json sentence_bert_config.json \
#     config_sentence_transformers.json 1_Pooling)
# and .whl (the packages the device lacks, as wheels: torchjd, sentence-transformers 6.2, the test extras;
# wordfreq's 56 MB wheel does not fit beside the rest, so tests/evaluation/test_lexical.py fails to import).
#   OUT=$OUT bash docs/results/h200-stage3/suite.sh
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
mkdir -p ../shared && tar -xJf .gpu/shared.tar.xz -C ../shared
cp -r .gpu/cs224n-offline ../shared/data/
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 - <<'PY'
import shutil
from safetensors.torch import load_file, save_file
shutil.copytree(".gpu/minilm-fp16", "/tmp/minilm", dirs_exist_ok=True)  # it travels in half precision
sd = {k: v.float() if v.is_floating_point() else v for k, v in load_file(".gpu/minilm-fp16/model.safetensors").items()}
save_file(sd, "/tmp/minilm/model.safetensors", metadata={"format": "pt"})
PY
[[ -f .gpu/minilm-st.tar.xz ]] && tar -xJf .gpu/minilm-st.tar.xz -C /tmp/minilm
export BERTCF_REAL_BERT=/tmp/minilm
python3 -m pip list 2>/dev/null | tr -s ' ' \
  | grep -i -E "^(torch|transformers|sentence-transformers|torchjd|peft|onnxruntime) "
echo "=== [$SECONDS s] the suite, ${WORKERS:-14} workers"
timeout $(( ${BUDGET:-400} - SECONDS )) python3 -m pytest -q -n "${WORKERS:-14}" --dist loadfile -rfEs --tb=line \
  -p no:cacheprovider --junitxml="$OUT/junit.xml" > "$OUT/suite.log" 2>&1
echo "=== rc $? at $SECONDS s"
grep -E "^(FAILED|ERROR) " "$OUT/suite.log" | cut -c1-220 | head -60
tail -3 "$OUT/suite.log"
