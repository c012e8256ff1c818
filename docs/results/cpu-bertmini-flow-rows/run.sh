#!/usr/bin/env bash
# Issue 64, part 4: the flow rows fine-tuned at a budget where the dev metrics have stopped rising,
# on the bert-mini base of the fine-tuned-rows table (docs/RESULTS.md, "The report's encoder rows,
# fine-tuned over three seeds"). Usage, from the repository root: run.sh OUT_DIR. Per seed, stage 3
# from
#   mirror        the Mirror encoder (no flow): the baseline
#   flow-trained  BERT-CF, the flow fine-tuned with the encoder (run_multitask.py's default)
#   flow-frozen   BERT-CF --freeze-flow: the flow kept as stage 2 left it, the encoder trained
#   flow-dropped  BERT-CF --drop-flow: the heads on f(x), the flow left out
# BERT-CF's stage 2 freezes the encoder, so flow-dropped starts from the Mirror encoder's weights: it
# differs from `mirror` only by the heads' random draws (the flow is built, taking its draws, before
# it is dropped).
# Stage 3 as in that table's 500-step series (lr 1e-4, batches 8/24/8, max length 64, 300 dev rows
# per task for the best-checkpoint choice, every dev row of best/ at the end), for STEPS steps
# (default 2000: that series' rows kept their last evaluation, step 500, in every seed, so they were
# still rising there), an evaluation every EVAL_EVERY steps (default 100) for the curves.
# The encoders come from `python -m bertcf.experiments mlm-base`, the table's recipe: the MLM base
# (MLM_STEPS, default 2000) from CONFIG (default: bert-mini's config.json, written to OUT_DIR/bert-mini),
# then Mirror and BERT-CF per seed, 200 steps each (STAGE_SCALE 0.02 of the report's 10^4). ROWS
# (default OUT_DIR/rows) may be the table's own output directory (with CONFIG its config): the
# experiments reuse the runs there whose settings match.
# A finished fine-tuning (metrics.json) is skipped and a stopped one continues from its last/
# (--resume); each run's wall time and peak memory go to OUT_DIR/times.txt. At the end: curves.png
# (each task's dev metric against the step) and compare.md/.json (each reading against `mirror`,
# the project's paired bootstrap over seeds and dev items).
# On a GPU: DEVICE=cuda (the pretraining's precision that device's default, stage 3's PRECISION, fp32
# unless given) and PARALLEL=1, every fine-tuning of every seed at once once the encoders exist.
set -euo pipefail
out=$1
DATA=${DATA:-../shared/data/cs224n-offline}
VOCAB=${VOCAB:-../shared/models/bert-base-uncased-vocab/vocab.txt}
CONFIG=${CONFIG:-$out/bert-mini} ROWS=${ROWS:-$out/rows}
SEEDS=${SEEDS:-"11711 1 2"}
STEPS=${STEPS:-2000} EVAL_EVERY=${EVAL_EVERY:-100}
DEVICE=${DEVICE:-cpu} PRECISION=${PRECISION:-fp32} PARALLEL=${PARALLEL:-0}
MLM_STEPS=${MLM_STEPS:-2000} STAGE_SCALE=${STAGE_SCALE:-0.02} STAGE_EVAL_EVERY=${STAGE_EVAL_EVERY:-100}
seeds=($SEEDS) ft=$out/finetune
common=(--data-dir "$DATA" --sst-batch-size 8 --qqp-batch-size 24 --sts-batch-size 8 --max-length 64
        --max-eval-examples 300 --precision "$PRECISION" --lr 1e-4 --device "$DEVICE" --progress lines --keep-last none
        --sst-test "$out/none.csv" --sts-test "$out/none.csv")  # no test predictions: not needed here

timed() {  # timed NAME COMMAND...: the command, its wall time and peak memory appended to times.txt
  local name=$1 start=$SECONDS rc=0; shift
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f "$name wall %e s, peak %M KB" -a -o "$out/times.txt" "$@" >> "$out/logs/$name.log" 2>&1
  else  # (a machine without GNU time: the wall time alone)
    "$@" >> "$out/logs/$name.log" 2>&1 || rc=$?
    echo "$name wall $(( SECONDS - start )) s" >> "$out/times.txt"
    return $rc
  fi
}

run() {  # run NAME SEED ENCODER FLAGS...: one stage-3 run into $ft/NAME-seedSEED
  local name=$1-seed$2 seed=$2 encoder=$3; shift 3
  [[ -f "$ft/$name/metrics.json" ]] && return 0
  local resume=()
  [[ -d "$ft/$name/last" ]] && resume=(--resume) || rm -rf "${ft:?}/$name"
  echo "$(date +%T) $name"
  timed "$name" python run_multitask.py "${common[@]}" --encoder "$encoder" --seed "$seed" --out-dir "$ft/$name" \
    --steps "$STEPS" --eval-every "$EVAL_EVERY" "${resume[@]}" "$@"
}

stage() {  # stage NAME SEED: the best/ of the experiments' pretraining NAME for SEED (the first seed's in stages/)
  [[ $2 == "${seeds[0]}" ]] && echo "$ROWS/stages/$1/best" || echo "$ROWS/seeds/$2/stages/$1/best"
}

mkdir -p "$out/logs" "$ft"
if [[ ! -f $CONFIG/config.json ]]; then  # bert-mini (Turc et al. 2019), no weights: the MLM base starts from it
  mkdir -p "$CONFIG"
  echo '{"model_type": "bert", "vocab_size": 30522, "hidden_size": 256, "num_hidden_layers": 4,
 "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 512}' > "$CONFIG/config.json"
  cp "$VOCAB" "$CONFIG/vocab.txt"
fi
# The encoders, once: the experiments skip what is done and write table1.md last.
if [[ ! -f $ROWS/table1.md ]]; then
  echo "$(date +%T) encoders"
  seed_list=$(IFS=,; echo "${seeds[*]}")
  timed encoders python -m bertcf.experiments mlm-base --config "$CONFIG" --data-dir "$DATA" --corpus-from-tasks \
    --mlm-steps "$MLM_STEPS" --steps-scale "$STAGE_SCALE" --eval-every "$STAGE_EVAL_EVERY" --no-finetune \
    --device "$DEVICE" --out-dir "$ROWS" --seed "${seeds[0]}" --seeds "$seed_list" --rows "MinBERT-Mirror,BERT-CF"
fi
pids=()
finetune() {  # finetune NAME SEED ENCODER_STAGE FLAGS...: one run, in the background with PARALLEL=1
  local name=$1 seed=$2 encoder; encoder=$(stage "$3" "$2"); shift 3
  if [[ $PARALLEL == 1 ]]; then run "$name" "$seed" "$encoder" "$@" & pids+=($!); else run "$name" "$seed" "$encoder" "$@"; fi
}
for seed in "${seeds[@]}"; do
  finetune mirror "$seed" mirror
  finetune flow-trained "$seed" bertcf
  finetune flow-frozen "$seed" bertcf --freeze-flow
  finetune flow-dropped "$seed" bertcf --drop-flow
done
# In the background, as one after another: a failed fine-tuning stops the script before the summaries.
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
if (( failed )); then echo "$failed fine-tuning(s) failed: see $out/logs" >&2; exit 1; fi
# The summaries, again only when a run has finished since they were written.
if [[ ! -f $out/compare.md || -n $(find "$ft" -name metrics.json -newer "$out/compare.md") ]]; then
  python -m bertcf.multitask.curves "$ft" --out "$out/curves.png"
  python -m bertcf.multitask.compare "$ft" --baseline mirror --out "$out/compare"
fi
