#!/usr/bin/env bash
# Permuted hidden dimensions (issue 16's stretch; "Hidden No More"'s setting): SmolLM2 states at layers
# 1, 15 and 30 with one seeded permutation of the 576 dimensions (not written to the file), 20 prompts of
# 20 tokens (prose 7, code 7, random ids 6; corpus seed 3), and one prose prompt alone at layer 15 (seed 4).
# `sipit invert` recovers π from the prompts' first positions and inverts the unpermuted states.
# Usage: OUT=/tmp/runs/perm bash docs/results/surfaces/permuted.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/runs/perm}
mkdir -p "$OUT"
sipit() { .venv/bin/python -m sipit --threads 1 "$@"; }
for L in 1 15 30; do
  sipit capture --model smollm2 --corpus prose:7,code:7,random:6 --length 20 --surface permuted --layer $L --seed 3 \
    -o "$OUT/p$L.safetensors"
  sipit invert "$OUT/p$L.safetensors" -q --max-seconds 120
done
sipit capture --model smollm2 --corpus prose:1 --length 20 --surface permuted --layer 15 --seed 4 -o "$OUT/one15.safetensors"
sipit invert "$OUT/one15.safetensors" -q --max-seconds 120
