#!/usr/bin/env bash
# Stage 3 on MiniLM at a budget where the dev metrics have stopped rising, against single-task runs
# and independent fine-tunes (docs/RESULTS.md, "Stage 3 at convergence"). Usage, from the
# repository root: run.sh SERIES OUT_DIR, SERIES one of
#   converged  per seed: the report's `all` (three tasks, weights 5/20/1); each task alone for as
#              many steps (--tasks sst|qqp|sts); each task alone with the head closest to its
#              reference (SST: [CLS], dropout 0.1; QQP: the pair read together); the references
#              (reference.py: transformers' Trainer on SST and QQP, sentence-transformers'
#              CosineSimilarityLoss on STS)
#   methods    per seed: round-robin at equal optimiser steps and at equal task batches, uncertainty
#              weighting, UPGrad (baseline: the converged series' `all`, run first if it is not there)
#   longer     per seed: `all` and each task alone (as in `converged`, skipped if it ran there), each
#              continued to twice the steps in a copy NAME-x2-seedSEED: is the budget long enough?
#   peft       per seed: the report's `all` with LoRA in the frozen encoder (--peft lora: rank 8, alpha 16,
#              every attention and feed-forward Linear layer), one adapter shared and one per task beside
#              it (--peft-scope per-task), at PEFT_LR (default 5e-4, LoRA's paper's for RoBERTa-base on SST-2
#              and QQP; full fine-tuning keeps 1e-5) (baseline: the converged series' `all`, as in methods)
# Batches of 16 per task, max length 64, lr 1e-5, STEPS steps (default 2040: two epochs of QQP's
# 16,258 training pairs; at one epoch, 1020, `all` still gained QQP accuracy from a second: the
# `longer` series, docs/RESULTS.md), an evaluation every EVAL_EVERY steps (default 170) on 1,000 dev
# rows per task drawn once for every run; the final metrics, every dev row of the best checkpoint.
# MINILM_DIR: ../shared/tools/get-minilm.sh MINILM_DIR. A finished run (metrics.json) is skipped
# and a stopped one continues from its last/ (--resume), so the series can stop and go on later.
# A finished run keeps best/ and last/ (about 440 MB), so that `longer` can continue it; delete them
# once the series is done. RECORDS (optional, e.g. this directory's runs-2040): each finished run's
# config, metrics and dev predictions are copied to RECORDS/NAME, and a run kept there with them is copied back
# into OUT_DIR and skipped, so that a series continues on a machine that has only the repository.
set -euo pipefail
series=$1 out=$2
MINILM_DIR=${MINILM_DIR:?set MINILM_DIR}
DATA=${DATA:-../shared/data/cs224n-offline}
SEEDS=${SEEDS:-"11711 1 2"}
RECORDS=${RECORDS:-}
STEPS=${STEPS:-2040} EVAL_EVERY=${EVAL_EVERY:-170} EVAL_ROWS=${EVAL_ROWS:-1000} PEFT_LR=${PEFT_LR:-5e-4}
here=$(dirname "$0")
common=(--model "$MINILM_DIR" --data-dir "$DATA" --sst-batch-size 16 --qqp-batch-size 16 --sts-batch-size 16
        --max-length 64 --lr 1e-5 --max-eval-examples "$EVAL_ROWS" --device cpu --precision fp32 --progress lines
        --sst-test "$out/none.csv" --sts-test "$out/none.csv")  # no test predictions: not needed here

timed() {  # timed NAME COMMAND...: the command, its wall time and peak memory appended to times.txt
  local name=$1; shift
  /usr/bin/time -f "$name wall %e s, peak %M KB" -a -o "$out/times.txt" "$@" >> "$out/$name.log" 2>&1
}

restore() {  # restore NAME: a run kept in $RECORDS (with its dev predictions, which compare reads) and
             # absent from $out copied back, so that it is skipped
  if [[ -n $RECORDS && -f $RECORDS/$1/metrics.json && -d $RECORDS/$1/predictions && ! -e $out/$1 ]]; then
    cp -a "$RECORDS/$1" "$out/$1"
  fi
}

keep() {  # keep NAME: the finished run's config, metrics and dev predictions copied to $RECORDS/NAME
  [[ -n $RECORDS ]] || return 0
  local to=$RECORDS/$1
  rm -rf "$to.tmp"; mkdir -p "$to.tmp/predictions"
  cp "$out/$1"/config.json "$out/$1"/metrics.json "$out/$1"/metrics.jsonl "$to.tmp/"
  cp "$out/$1"/predictions/*-dev-output.csv "$to.tmp/predictions/"
  rm -rf "$to"; mv "$to.tmp" "$to"
}

run() {  # run NAME STEPS FLAGS...: one stage-3 run into $out/NAME
  local name=$1 steps=$2; shift 2
  restore "$name"
  [[ -f "$out/$name/metrics.json" ]] && return 0
  local resume=()
  [[ -d "$out/$name/last" ]] && resume=(--resume) || rm -rf "${out:?}/$name"
  echo "$(date +%T) $name"
  timed "$name" python run_multitask.py "${common[@]}" --out-dir "$out/$name" --steps "$steps" \
    --eval-every "$EVAL_EVERY" "${resume[@]}" "$@"
  keep "$name"
}

longer() {  # longer NAME FLAGS...: the finished run $out/NAME (made with FLAGS) continued to twice its
            # steps in a copy, $out/NAME with -x2 before -seed
  local name=$1 copy=${1%-seed*}-x2-seed${1##*-seed} steps=$((2 * STEPS)); shift
  # finished: an evaluation at the last step, and the final metrics written after it
  if grep -q "\"step\": $steps," "$out/$copy/metrics.jsonl" 2>/dev/null \
     && [[ "$out/$copy/metrics.json" -nt "$out/$copy/metrics.jsonl" ]]; then return 0; fi
  if [[ ! -d "$out/$copy" && ! -d "$out/$name/last" ]]; then
    echo "$out/$name has no last/ checkpoint to continue (restored from RECORDS?): run it here first" >&2; exit 2
  fi
  if [[ ! -d "$out/$copy" ]]; then rm -rf "${out:?}/$copy.tmp"; cp -a "$out/$name" "$out/$copy.tmp"; mv "$out/$copy.tmp" "$out/$copy"; fi
  echo "$(date +%T) $copy"
  timed "$copy" python run_multitask.py "${common[@]}" --out-dir "$out/$copy" --steps "$steps" \
    --eval-every "$EVAL_EVERY" --resume "$@"
  keep "$copy"
}

reference() {  # reference TASK SEED: reference.py into $out/ref-TASK-seedSEED
  local name=ref-$1-seed$2
  restore "$name"
  [[ -f "$out/$name/metrics.json" ]] && return 0
  rm -rf "${out:?}/$name"
  echo "$(date +%T) $name"
  timed "$name" python "$here/reference.py" --task "$1" --seed "$2" --model "$MINILM_DIR" --data-dir "$DATA" \
    --out "$out/$name" --steps "$STEPS" --batch-size 16 --lr 1e-5 --max-length 64 --eval-every "$EVAL_EVERY" \
    --max-eval-examples "$EVAL_ROWS"
  keep "$name"
}

mkdir -p "$out"
case $series in
  converged)
    for seed in $SEEDS; do
      run "all-seed$seed" "$STEPS" --seed "$seed"
      for task in sst qqp sts; do
        run "$task-alone-seed$seed" "$STEPS" --seed "$seed" --tasks "$task"
        reference "$task" "$seed"
      done
      run "sst-cls-seed$seed" "$STEPS" --seed "$seed" --tasks sst --pooling cls --sst-dropout 0.1
      run "qqp-cross-seed$seed" "$STEPS" --seed "$seed" --tasks qqp --pair-encoding cross
    done ;;
  methods)
    for seed in $SEEDS; do
      run "all-seed$seed" "$STEPS" --seed "$seed"
      run "round-robin-steps-seed$seed" "$STEPS" --seed "$seed" --task-sampling round-robin
      run "round-robin-batches-seed$seed" "$((3 * STEPS))" --seed "$seed" --task-sampling round-robin \
        --eval-every "$((3 * EVAL_EVERY))"
      run "uncertainty-seed$seed" "$STEPS" --seed "$seed" --task-weighting uncertainty
      run "upgrad-seed$seed" "$STEPS" --seed "$seed" --aggregator upgrad
    done ;;
  longer)
    for seed in $SEEDS; do
      run "all-seed$seed" "$STEPS" --seed "$seed"; longer "all-seed$seed" --seed "$seed"
      for task in sst qqp sts; do
        run "$task-alone-seed$seed" "$STEPS" --seed "$seed" --tasks "$task"
        longer "$task-alone-seed$seed" --seed "$seed" --tasks "$task"
      done
    done ;;
  peft)
    for seed in $SEEDS; do
      run "all-seed$seed" "$STEPS" --seed "$seed"
      run "lora-seed$seed" "$STEPS" --seed "$seed" --peft lora --lr "$PEFT_LR"
      run "lora-per-task-seed$seed" "$STEPS" --seed "$seed" --peft lora --peft-scope per-task --lr "$PEFT_LR"
    done ;;
  *) echo "unknown series $series (converged, methods, longer, peft)" >&2; exit 2 ;;
esac
