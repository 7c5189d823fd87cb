#!/usr/bin/env bash
# The cells the 14:32-16:11 run (rerun-chain.sh) left short of 20/20, rerun with the current code:
# Gemma-3's logits and log-probs (one random-id prompt hit the 120 s cap) and larger projections at the
# last layer, where k = 64 left prompts capped (SmolLM2 k = 128 at 30, Gemma-3 k = 256 at 18). Captures are acceptance.sh's (same corpus,
# same seed); the cap is raised so that a slow prompt is timed instead of dropped.
# Usage: OUT=/tmp/runs/s3 bash docs/results/surfaces/runs/gaps.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/runs/s3}
sipit() { .venv/bin/python -m sipit --threads 2 "$@"; }
cap() {  # model, name, capture args...
  local m=$1 f="$OUT/$1/$2.safetensors"; shift 2; mkdir -p "$OUT/$m"
  [ -f "$f" ] || sipit capture --model "$m" --corpus prose:7,code:7,random:6 --length 20 "$@" -o "$f" >/dev/null
}
inv() {  # cap seconds, files...
  local c=$1; shift; date -u; sipit invert -q --max-seconds "$c" "$@" 2>&1 | grep -v Warning || true
}
G=$OUT/gemma3-270m; M=$OUT/smollm2
cap gemma3-270m logits --surface logits
cap gemma3-270m logprobs --surface logprobs
cap smollm2 proj-gaussian-k128-L30 --surface projection:128 --layer 30
cap gemma3-270m proj-gaussian-k256-L18 --surface projection:256 --layer 18
inv 600 $G/logits.safetensors $G/logprobs.safetensors
inv 300 $M/proj-gaussian-k128-L30.safetensors
inv 300 $G/proj-gaussian-k256-L18.safetensors
date -u; echo done
