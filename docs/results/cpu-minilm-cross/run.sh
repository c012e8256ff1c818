#!/usr/bin/env bash
# Cross-encoders and GPL (issue 51), from MiniLM (and issue 24's bert-mini MLM base for GPL), one seed:
# 1. cross-encoders from MiniLM on CS224N STS train (sentence-transformers' STS recipe: batch 16,
#    lr 2e-5, 1,500 steps = 4 epochs) and on QQP train (the same, 1,016 steps = 1 epoch), against
#    MiniLM as a bi-encoder fine-tuned on the same pairs (SBERT's cosine regression, the same
#    steps): CS224N STS dev, QQP dev and STS-B test, all scored by `python -m bertcf.cross evaluate`;
# 2. stage 3 from MiniLM, bi-encoder against --pair-encoding cross, 100 steps, max length 64;
# 3. the Quora set in BEIR's layout: MiniLM alone against MiniLM + the QQP cross-encoder (top 100);
# 4. GPL with the QQP train questions as the queries (no generator here), negatives mined by the
#    encoder being adapted, the QQP cross-encoder's margins, 500 steps of batch 32 at length 64;
#    MiniLM and the MLM base before and after, on the Quora set.
# Usage: run.sh MINILM_DIR CS224N_DIR SENTEVAL_DIR MLM_BASE OUT
set -euo pipefail
minilm=$1 data=$2 senteval=$3 base=$4 out=$5
mkdir -p "$out"
timed() { local name=$1 t0; shift; t0=$(date +%s); "$@"; echo "$name: $(( $(date +%s) - t0 )) s" >> "$out/wall.txt"; }
done_() { [[ -f $1 ]]; }
common=(--device cpu --progress lines --seed 11711)

# 1. Cross-encoders and bi-encoders on the same pairs.
done_ "$out/ce-sts/best/model.safetensors" || timed ce-sts python -m bertcf.cross train --model "$minilm" \
  --data-dir "$data" --train-file "$data/sts-train.csv" --steps 1500 --eval-every 250 "${common[@]}" --out-dir "$out/ce-sts"
done_ "$out/ce-qqp/best/model.safetensors" || timed ce-qqp python -m bertcf.cross train --model "$minilm" \
  --data-dir "$data" --train-file "$data/quora-train.csv" --steps 1016 --warmup-steps 102 --eval-every 254 \
  "${common[@]}" --out-dir "$out/ce-qqp"
done_ "$out/bi-sts/best/model.safetensors" || timed bi-sts python run_pretrain.py --stage supervised \
  --method sbert-cosine --preset sbert-sts --model "$minilm" --data-dir "$data" --select-on last "${common[@]}" \
  --out-dir "$out/bi-sts"
done_ "$out/bi-qqp/best/model.safetensors" || timed bi-qqp python run_pretrain.py --stage supervised \
  --method sbert-cosine --preset sbert-sts --train-file "$data/quora-train.csv" --steps 1016 --warmup-steps 102 \
  --model "$minilm" --data-dir "$data" --select-on last "${common[@]}" --out-dir "$out/bi-qqp"
for run in ce-sts ce-qqp bi-sts bi-qqp; do
  done_ "$out/pairs-$run.json" || python -m bertcf.cross evaluate --model "$out/$run/best" --data-dir "$data" \
    --senteval-dir "$senteval" --device cpu --json "$out/pairs-$run.json"
done
done_ "$out/pairs-minilm.json" || python -m bertcf.cross evaluate --model "$minilm" --data-dir "$data" \
  --senteval-dir "$senteval" --device cpu --json "$out/pairs-minilm.json"

# 2. Stage 3, the pairs apart and together.
for enc in bi cross; do
  done_ "$out/mt-$enc/metrics.json" || timed "mt-$enc" python run_multitask.py --model "$minilm" --data-dir "$data" \
    --pair-encoding "$enc" --steps 100 --eval-every 50 --max-length 64 "${common[@]}" --out-dir "$out/mt-$enc"
done

# 3. Reranking the Quora set.
quora=$out/beir-quora
[[ -d $quora ]] || python -m bertcf.data beir-quora --data-dir "$data" --out "$quora"
done_ "$out/quora-minilm.json" || timed quora-minilm python -m bertcf.evaluate --encoder "$minilm" --tasks retrieval \
  --retrieval-dir "$quora" --device cpu --no-progress --json "$out/quora-minilm.json"
done_ "$out/quora-rerank.json" || timed quora-rerank python -m bertcf.evaluate --encoder "$minilm" --tasks retrieval \
  --retrieval-dir "$quora" --rerank "$out/ce-qqp/best" --rerank-top 100 --device cpu --no-progress \
  --json "$out/quora-rerank.json"

# 4. GPL on the Quora corpus, the train questions as its queries.
queries=$out/quora-train-queries
[[ -d $queries ]] || python -m bertcf.data beir-quora --data-dir "$data" --queries-from train \
  --exclude-questions-of dev --split train --out "$queries"
for who in minilm base; do
  model=$([[ $who == minilm ]] && echo "$minilm" || echo "$base")
  done_ "$out/gpl-$who/model/best/model.safetensors" || timed "gpl-$who" python -m bertcf.gpl --encoder "$model" \
    --out "$out/gpl-$who" --queries "$queries" --cross-encoder "$out/ce-qqp/best" --data-dir "$data" --device cpu \
    --progress lines \
    -- --steps 500 --warmup-steps 50 --max-length 64 --log-every 100
  done_ "$out/quora-$who.json" || python -m bertcf.evaluate --encoder "$model" --tasks retrieval \
    --retrieval-dir "$quora" --device cpu --no-progress --json "$out/quora-$who.json"
  for score in dot cos; do
    done_ "$out/quora-$who-gpl-$score.json" || python -m bertcf.evaluate --encoder "$out/gpl-$who/model" \
      --tasks retrieval --retrieval-dir "$quora" --retrieval-score "$score" --device cpu --no-progress \
      --json "$out/quora-$who-gpl-$score.json"
  done
done
