#!/usr/bin/env bash
# Issue 70, item 1, in one call on a lent GPU: stage 3 at the report's scale on MiniLM, every run of every
# seed at once on the one GPU, then `python -m bertcf.multitask.compare` against the report's `all` (every
# task's batch each step, weights 5/20/1). SERIES picks the runs beside `all`, per seed:
#   tasks    each task alone for as many steps (--tasks sst|qqp|sts) and round-robin at equal optimiser steps
#   methods  round-robin at equal task batches (three times the steps), uncertainty weighting, UPGrad
#            (torchjd's solver: carry the quadprog and qpsolvers wheels beside torchjd's)
#   peft     LoRA in the frozen encoder, one adapter shared and one per task beside it, at lr PEFT_LR
# The report's batches (32/96/32), lr 1e-5, max length 128 (the defaults); STEPS (the report's 5,000)
# lowered to what the time box holds, from a calibration run of `all` alone (its pace) and each run's work
# in `all` runs (one task's batch a step costs about a third), so that every run finishes and is scored.
# The table says which STEPS ran.
#
# On the device machine, from the repository root, with ../shared/tools/pack-for-gpu.sh .gpu carried (and
# torchjd, which that machine lacks, installed from a carried wheel first):
#   OUT=$OUT [SERIES=tasks] bash docs/results/h200-stage3/run.sh
# Rehearsed on the CPU with tiny settings (nothing unpacked, MiniLM and the data where they are):
#   SETUP=0 DATA=../shared/data/cs224n-offline DEVICE=cpu PRECISION=fp32 MINILM=DIR SEEDS=1 STEPS=6 \
#     CAL_STEPS=4 BATCHES="4 6 4" MAX_LENGTH=32 EVAL_ROWS=50 BUDGET=900 OUT=/tmp/out \
#     bash docs/results/h200-stage3/run.sh
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-540} DEVICE=${DEVICE:-cuda} PRECISION=${PRECISION:-bf16} SEEDS=${SEEDS:-"11711 1 2"}
STEPS=${STEPS:-5000} CAL_STEPS=${CAL_STEPS:-300} EVAL_ROWS=${EVAL_ROWS:-1000} MAX_LENGTH=${MAX_LENGTH:-128}
read -r SST_B QQP_B STS_B <<< "${BATCHES:-32 96 32}"
MINILM=${MINILM:-/tmp/minilm} DATA=${DATA:-.gpu/cs224n-offline} RUNS=${RUNS:-/tmp/stage3}
SERIES=${SERIES:-tasks} PEFT_LR=${PEFT_LR:-5e-4}
# Each run beside `all`: NAME WORK STEPS_FACTOR FLAGS... (WORK: its cost in `all` runs at the same steps; those
# of `methods` and `peft` from their runs' wall times side by side on the H200, 2026-11-29, in RESULTS)
case $SERIES in
  tasks) plan=("sst-alone 0.33 1 --tasks sst" "qqp-alone 0.33 1 --tasks qqp" "sts-alone 0.33 1 --tasks sts"
               "round-robin 0.33 1 --task-sampling round-robin") ;;
  methods) plan=("round-robin-batches 0.5 3 --task-sampling round-robin" "uncertainty 1.5 1 --task-weighting uncertainty"
                 "upgrad 2 1 --aggregator upgrad") ;;
  peft) plan=("lora 1.2 1 --peft lora --lr $PEFT_LR" "lora-per-task 3.5 1 --peft lora --peft-scope per-task --lr $PEFT_LR") ;;
  *) echo "SERIES: tasks, methods or peft, not $SERIES" >&2; exit 2 ;;
esac
plan=("all 1 1" "${plan[@]}")
# A seed's work in `all` runs
ALL_EQUIVALENTS=${ALL_EQUIVALENTS:-$(printf '%s\n' "${plan[@]}" | awk '{w += $2 * $3} END {print w}')}
# Runs side by side overlap their launches (the step is launch-bound, 1.8x its kernel time): an estimate
# (on the H200, 15 runs did about 2.8 times the work of `all` alone in the same time; 1.3 was given; `methods`'
# 12 runs, given 1.8 with the lower costs of before, finished in 311 of their 420 s).
OVERLAP=${OVERLAP:-1.5}

if [[ ${SETUP:-1} != 0 ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  python3 - <<'PY'
import shutil
from safetensors.torch import load_file, save_file
shutil.copytree(".gpu/minilm-fp16", "/tmp/minilm", dirs_exist_ok=True)  # it travels in half precision
sd = {k: v.float() if v.is_floating_point() else v for k, v in load_file(".gpu/minilm-fp16/model.safetensors").items()}
save_file(sd, "/tmp/minilm/model.safetensors", metadata={"format": "pt"})
PY
fi
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
mkdir -p "$RUNS"
common=(--model "$MINILM" --data-dir "$DATA" --device "$DEVICE" --precision "$PRECISION" --progress lines
        --sst-batch-size "$SST_B" --qqp-batch-size "$QQP_B" --sts-batch-size "$STS_B" --max-length "$MAX_LENGTH"
        --max-eval-examples "$EVAL_ROWS" --keep-last none --sst-test "$RUNS/none.csv" --sts-test "$RUNS/none.csv")

# 1. The pace of `all` alone on the device (steps a second, from its last progress line).
echo "=== [$SECONDS s] calibration: all, $CAL_STEPS steps"
timeout 240 python3 run_multitask.py "${common[@]}" --out-dir "$RUNS/calibration" --steps "$CAL_STEPS" \
  --eval-every "$CAL_STEPS" --log-every 50 > "$OUT/calibration.log" 2>&1
pace=$(python3 - "$OUT/calibration.log" <<'PY'
import re, sys
lines = re.findall(r"([\d.]+) (steps/s|s/step)", open(sys.argv[1]).read())
value, unit = lines[-1] if lines else ("0", "steps/s")
print(float(value) if unit == "steps/s" else 1 / float(value))
PY
)
left=$(( BUDGET - SECONDS - 90 ))  # 90 s: start-up, the evaluations, the final scoring and the comparison
seeds=$(wc -w <<< "$SEEDS")
steps=$(python3 -c "print(max(10, min($STEPS, int($pace * $left * $OVERLAP / ($seeds * $ALL_EQUIVALENTS)))))")
echo "=== [$SECONDS s] all alone: $pace steps/s; $left s left for $seeds seed(s): $steps steps a run"

# 2. Every run of every seed at once, each stopped cleanly (SIGTERM) at the deadline if still running.
for seed in $SEEDS; do
  for entry in "${plan[@]}"; do
    read -r run _ factor extra <<< "$entry"
    n=$(( steps * factor )) every=$(( steps * factor / 5 > 0 ? steps * factor / 5 : 1 ))
    # shellcheck disable=SC2086  # extra: the run's flags, split on spaces
    timeout "$(( BUDGET - SECONDS - 30 ))" python3 run_multitask.py "${common[@]}" --out-dir "$RUNS/$run-seed$seed" \
      --steps "$n" --eval-every "$every" --seed "$seed" $extra > "$OUT/$run-seed$seed.log" 2>&1 &
  done
done
wait
echo "=== [$SECONDS s] runs done: $(ls "$RUNS"/*-seed*/metrics.json 2>/dev/null | wc -l) of $(( seeds * ${#plan[@]} )) scored"

# 3. The verdicts against `all` of the runs that finished (one past the deadline loses no other's), and what
# the runs wrote, their dev predictions too (compare reads them, to be run again at home), into $OUT.
labels=$(for entry in "${plan[@]:1}"; do run=${entry%% *}
           compgen -G "$RUNS/$run-seed*/metrics.json" > /dev/null && echo "$run"; done | paste -sd, -)
[[ -n $labels ]] && python3 -m bertcf.multitask.compare "$RUNS" --baseline all --labels "$labels" --out "$OUT/stage3" 2>&1 | tail -30
for run in "$RUNS"/*-seed*; do
  mkdir -p "$OUT/runs/${run##*/}" && cp -r "$run"/{config.json,metrics.json,metrics.jsonl,environment.json,predictions} \
    "$OUT/runs/${run##*/}/" 2>/dev/null
done
echo "series $SERIES, steps $steps, pace $pace steps/s, done at $SECONDS s" | tee "$OUT/summary.txt"
# $OUT brings back 8 files at most: the logs and the runs' records travel as one archive.
tar -czf /tmp/h200-stage3.tgz -C "$OUT" --exclude=stage3.md --exclude=stage3.json --exclude=summary.txt . \
  && rm -rf "$OUT"/*.log "$OUT/runs" && mv /tmp/h200-stage3.tgz "$OUT/"
