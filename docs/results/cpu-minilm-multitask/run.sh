#!/usr/bin/env bash
# Stage 3 measured on MiniLM, 2-core CPU (docs/RESULTS.md, "Stage 3: tasks, sampling and the
# multitask methods"). Usage: run.sh SERIES OUT_DIR, SERIES one of
#   sampling  all (the report's: a batch of every task each step, 80 steps) and the four modes that
#             draw one task a step (240 steps: the same 240 task batches), 3 seeds
#   methods   pcgrad, upgrad, uncertainty, dwa, smart, 3 seeds, 80 steps (their baseline, the
#             report's fixed-weight sum, is the sampling series' "all": run both into one OUT_DIR)
#   four      the three tasks and the three plus SNLI (train: snli-validation, dev: snli-test), seed 11711
# Evaluations during training read the first 300 rows of each dev file (step 0 and the last step);
# the final dev metrics and predictions, every row.
# MINILM_DIR: ../shared/tools/get-minilm.sh MINILM_DIR. Runs already finished (metrics.json) are
# skipped, so a stopped series continues where it stopped.
set -euo pipefail
series=$1 out=$2
MINILM_DIR=${MINILM_DIR:?set MINILM_DIR}
DATA=${DATA:-../shared/data/cs224n-offline}
NLI=$(realpath "${NLI:-../shared/data/nli}")  # absolute: a task file's relative paths start at its folder
SEEDS=${SEEDS:-"11711 1 2"}
common=(--model "$MINILM_DIR" --data-dir "$DATA" --sst-batch-size 8 --qqp-batch-size 24 --sts-batch-size 8
        --max-length 64 --max-eval-examples 300 --device cpu --precision fp32
        --sst-test "$out/none.csv" --sts-test "$out/none.csv")  # no test predictions: not needed here

run() {  # run NAME FLAGS...: one run into $out/NAME, timed
  local name=$1; shift
  [[ -f "$out/$name/metrics.json" ]] && return 0
  rm -rf "${out:?}/$name"
  /usr/bin/time -f "$name wall %e s, peak %M KB" -a -o "$out/times.txt" \
    python run_multitask.py "${common[@]}" --out-dir "$out/$name" "$@" > "$out/$name.log" 2>&1
}

mkdir -p "$out"
case $series in
  sampling)
    for seed in $SEEDS; do
      run "all-seed$seed" --seed "$seed" --steps 80 --eval-every 80
      for mode in round-robin proportional temperature annealed; do
        run "$mode-seed$seed" --seed "$seed" --steps 240 --eval-every 240 --task-sampling "$mode"
      done
    done ;;
  methods)
    for seed in $SEEDS; do
      run "pcgrad-seed$seed" --seed "$seed" --steps 80 --eval-every 80 --aggregator pcgrad
      run "upgrad-seed$seed" --seed "$seed" --steps 80 --eval-every 80 --aggregator upgrad
      run "uncertainty-seed$seed" --seed "$seed" --steps 80 --eval-every 80 --task-weighting uncertainty
      run "dwa-seed$seed" --seed "$seed" --steps 80 --eval-every 80 --task-weighting dwa --dwa-window 10
      run "smart-seed$seed" --seed "$seed" --steps 80 --eval-every 80 --smart-weight 1.0
    done ;;
  four)
    printf '%s\n' "- name: snli" "  kind: pair-classification" "  train: $NLI/snli-validation.tsv" \
      "  dev: $NLI/snli-test.tsv" "  text_columns: [premise, hypothesis]" \
      "  labels: [entailment, neutral, contradiction]" "  loss: softmax" "  batch_size: 8" > "$out/snli.yaml"
    run "three-seed11711" --steps 80 --eval-every 80
    run "four-seed11711" --steps 80 --eval-every 80 --task-file "$out/snli.yaml" ;;
  *) echo "unknown series $series" >&2; exit 2 ;;
esac
