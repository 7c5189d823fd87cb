#!/usr/bin/env bash
# Issue 16 acceptance on real models (run after merging engine + learned + surfaces, on a quiet machine).
# For each model: 20 prompts of 20 tokens (prose, code, random ids), every surface, layers 1, L/2, L;
# KV and logits are computed by plain transformers calls (model(ids).past_key_values / .logits).
# Prints one summary line per run; results JSONL + summary JSON next to each file in $OUT.
# Usage: bash docs/results/surfaces/acceptance.sh [smollm2|gemma3-270m ...]   (THREADS=2 by default)
set -euo pipefail
OUT=${OUT:-docs/results/surfaces/runs}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
sipit() { python -m sipit --threads "$THREADS" "$@"; }
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(smollm2 gemma3-270m)
for model in "${models[@]}"; do
  case $model in smollm2) L=30;; gemma3-270m) L=18;; *) echo "layers of $model?"; exit 2;; esac
  corpus="prose:7,code:7,random:6"
  run() {  # name, capture args...
    local f="$OUT/$model-$1.safetensors"; shift
    sipit capture --model "$model" --corpus "$corpus" --length 20 "$@" -o "$f"
    sipit invert "$f" -q | tail -1
  }
  for layer in 1 $((L / 2)) $L; do
    for part in keys values both; do run "kv-$part-L$layer" --surface "kv:$part" --layer "$layer"; done
    run "states-fp8-L$layer" --surface states --layer "$layer" --storage fp8
    run "states-int8-L$layer" --surface states --layer "$layer" --storage int8-row
  done
  run logits --surface logits
  run logprobs --surface logprobs
  # projections: start from the smallest k that docs/results/surfaces/projection_k.py reports, and above
  for layer in 1 $((L / 2)) $L; do
    for k in 8 32 128; do run "proj-gaussian-$k-L$layer" --surface "projection:$k" --layer "$layer"; done
  done
done
