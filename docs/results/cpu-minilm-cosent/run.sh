#!/usr/bin/env bash
# SBERT's cosine regression, CoSENT and AnglE from MiniLM on CS224N STS train, three seeds each, the
# sbert-sts preset's settings for all (batch 16, lr 2e-5, 4 epochs, 10% warm-up, linear decay,
# max length 128), the last checkpoint kept (--select-on last: the dev set scores, it does not choose).
# Usage: run.sh MINILM_DIR DATA_DIR OUT
set -euo pipefail
minilm=$1 data=$2 out=$3
for seed in 11711 1 2; do
  for method in sbert-cosine cosent angle; do
    [[ -f $out/$method-$seed/best/model.safetensors ]] && continue
    python run_pretrain.py --stage supervised --method "$method" --preset sbert-sts --model "$minilm" \
      --data-dir "$data" --select-on last --seed "$seed" --device cpu --progress lines \
      --out-dir "$out/$method-$seed"
  done
done
