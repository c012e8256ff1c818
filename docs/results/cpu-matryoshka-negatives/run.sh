#!/usr/bin/env bash
# Matryoshka, mined hard negatives and early stopping (issue 49), from MiniLM and from a bert-mini
# MLM base trained here (issue 24's recipe). Every supervised run: supervised SimCSE with SimCSE's
# published loss (--negatives simcse: sentence-transformers' MultipleNegativesRankingLoss with hard
# negatives), mean pooling, batch 64, lr 2e-5 (the base: 5e-5), 10% warm-up then linear decay,
# max length 64, one epoch of its triples, the last checkpoint kept; STS-B test at each width after.
# Usage: run.sh MINILM_DIR BERTMINI_CONFIG_DIR CS224N_DIR SENTEVAL_DIR NLI_DIR OUT
set -euo pipefail
minilm=$1 bertmini=$2 data=$3 senteval=$4 nli=$5 out=$6
mkdir -p "$out"
stamp() { date +%s; }

# SNLI's test and validation splits in one file (the mining reads one).
snli=$out/snli.tsv
[[ -f $snli ]] || { head -1 "$nli/snli-test.tsv"; tail -n +2 "$nli/snli-test.tsv"; tail -n +2 "$nli/snli-validation.tsv"; } > "$snli"

# 1. The MLM base, as issue 24 trained it (its row alone: nothing else of the suite).
python -m bertcf.experiments mlm-base --config "$bertmini" --data-dir "$data" --corpus-from-tasks --mlm-steps 7000 \
  --steps-scale 0.1 --eval-every 250 --no-finetune --senteval-dir "$senteval" --device cpu --out-dir "$out/base" \
  --rows "Random weights"
base=$out/base/stages/mlm-base/best

epoch() { python -c "import math,sys; print(math.ceil(int(sys.argv[1]) / 64))" "$1"; }
train() {  # name model lr steps files... [-- more flags]
  local name=$1 model=$2 lr=$3 steps=$4; shift 4
  [[ -f $out/$name/best/model.safetensors ]] && return
  local t0; t0=$(stamp)
  python run_pretrain.py --stage supervised --method simcse-sup --negatives simcse --pooling mean --batch-size 64 \
    --lr "$lr" --max-length 64 --lr-schedule linear --warmup-steps $(( steps / 10 )) --steps "$steps" \
    --eval-every 50 --select-on last --model "$model" --data-dir "$data" --device cpu --progress lines \
    --out-dir "$out/$name" "$@"
  echo "$name: $(( $(stamp) - t0 )) s" >> "$out/wall.txt"
}
for who in minilm base; do
  model=$([[ $who == minilm ]] && echo "$minilm" || echo "$base")
  lr=$([[ $who == minilm ]] && echo 2e-5 || echo 5e-5)
  dims=$([[ $who == minilm ]] && echo 384,256,128,64,32 || echo 256,128,64,32,16)
  # The base's cosines are all high (an MLM encoder is anisotropic): MiniLM's filters (a cap of 0.8 and
  # a 5% margin below the positive) left it 16 negatives for 6,695 pairs, the margin alone 313, so it
  # mines by rank alone.
  filters=$([[ $who == minilm ]] && echo "--max-score 0.8 --relative-margin 0.05" || true)
  # 2. MNRL on SNLI's triples (the contradictions as hard negatives), without and with Matryoshka.
  train "$who-mnrl" "$model" "$lr" 100 --train-file "$snli"
  train "$who-matryoshka" "$model" "$lr" 100 --train-file "$snli" --matryoshka-dims "$dims"
  # 3. The same with negatives mined by the encoder itself instead of the contradictions.
  mined=$out/$who-mined.tsv
  [[ -f $mined ]] || python -m bertcf.data mine-negatives --encoder "$model" --nli "$snli" --out "$mined" \
    --num-negatives 1 --range-min 10 --range-max 50 $filters --device cpu --no-progress
  train "$who-mined" "$model" "$lr" "$(epoch "$(( $(wc -l < "$mined") - 1 ))")" --train-file "$mined"
done

# 4. Early stopping: the MiniLM MNRL run selected on CS224N STS dev every 10 steps, with and without --patience 3.
for patience in none 3; do
  name=minilm-mnrl-select-$patience
  train "$name" "$minilm" 2e-5 100 --train-file "$snli" --select-on cs224n-sts --eval-every 10 \
    $([[ $patience == none ]] || echo --patience "$patience")
done

# 5. STS-B test at every width (and MiniLM and the base themselves, truncated).
for run in "$minilm" "$base" "$out"/*-mnrl "$out"/*-matryoshka "$out"/*-mined "$out"/minilm-mnrl-select-*; do
  name=$([[ $run == "$minilm" ]] && echo minilm || { [[ $run == "$base" ]] && echo base || basename "$run"; })
  widths=$([[ $name == minilm* ]] && echo "384 256 128 64 32" || echo "256 128 64 32 16")
  for k in $widths; do
    [[ -f $out/eval/$name-$k.json ]] && continue
    mkdir -p "$out/eval"
    python -m bertcf.evaluate --encoder "$run" --senteval-dir "$senteval" --tasks STSBenchmark --truncate-dim "$k" \
      --device cpu --no-progress --json "$out/eval/$name-$k.json" > /dev/null
  done
done
