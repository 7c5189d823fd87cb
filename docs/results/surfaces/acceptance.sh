#!/usr/bin/env bash
# Issue 16 acceptance on real models: for each model, 20 prompts of 20 tokens (prose:7, code:7,
# random:6; sources the learned calibration never saw) captured on every surface, then inverted.
# KV caches and logits come from plain transformers calls (model(ids, use_cache=True).past_key_values,
# model(ids).logits); states and projections from output_hidden_states (`sipit capture`).
#
# Every file of a model is inverted by ONE `sipit invert DIR`: the learned policy's missing
# calibrations (one per surface, layer and projection) are fitted in one shared forward pass, then
# each file runs; rerunning skips finished files. table.py turns the summaries into table.md.
#
# Usage: bash docs/results/surfaces/acceptance.sh [smollm2|gemma3-270m ...]
#        OUT=... THREADS=2 CAP=120 (seconds per prompt; a capped prompt counts as failed)
#        KS="64 16 4" (projection sizes)  STORAGE="fp8 int8-row" (states stored in low precision; "" = none)
set -euo pipefail
OUT=${OUT:-docs/results/surfaces/runs}
THREADS=${THREADS:-2}
CAP=${CAP:-120}
KS=${KS:-"64 16 4"}
STORAGE=${STORAGE-"fp8 int8-row"}
sipit() { python -m sipit --threads "$THREADS" "$@"; }
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(smollm2 gemma3-270m)
for model in "${models[@]}"; do
  case $model in smollm2) L=30;; gemma3-270m) L=18;; *) echo "layers of $model?"; exit 2;; esac
  dir="$OUT/$model"
  mkdir -p "$dir"
  cap() {  # name, capture args...
    local f="$dir/$1.safetensors"; shift
    [ -f "$f" ] || sipit capture --model "$model" --corpus prose:7,code:7,random:6 --length 20 "$@" -o "$f" >/dev/null
  }
  for layer in 1 $((L / 2)) $L; do
    for part in keys values both; do cap "kv-$part-L$layer" --surface "kv:$part" --layer "$layer"; done
    for fmt in $STORAGE; do cap "states-$fmt-L$layer" --surface states --layer "$layer" --storage "$fmt"; done
    for k in $KS; do cap "proj-gaussian-k$k-L$layer" --surface "projection:$k" --layer "$layer"; done
  done
  cap logits --surface logits
  cap logprobs --surface logprobs
  start=$(date +%s)
  sipit invert "$dir" -q --max-seconds "$CAP" | tee "$dir/invert.log" || true  # a failed file is a result
  echo "$model: $(( $(date +%s) - start )) s (calibration pass included)" | tee -a "$dir/invert.log"
done
python docs/results/surfaces/table.py "$OUT" > "$OUT/table.md"
cat "$OUT/table.md"
