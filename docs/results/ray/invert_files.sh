#!/usr/bin/env bash
# `sipit invert DIR` of many files: local (1 thread) vs --engine ray (2 single-threaded workers).
# 8 files (4 × tiny-gpt2 layer 1, 4 × tiny-llama layer 2), 8 corpus prompts of 20 tokens each.
# Wall time of the whole command (model loads and Ray start-up included) and the inversion seconds
# the command reports. Usage: bash docs/results/ray/invert_files.sh [WORKDIR]
set -euo pipefail
W=${1:-/tmp/sipit-invert-files}
sipit() { python -m sipit --threads 1 "$@"; }
rm -rf "$W" && mkdir -p "$W/states"
for i in 0 1 2 3; do
  sipit capture --model tiny-gpt2 --layer 1 --corpus prose:4,code:2,random:2 --seed $i -o "$W/states/gpt2_$i.safetensors" >/dev/null
  sipit capture --model tiny-llama --layer 2 --corpus prose:4,code:2,random:2 --seed $i -o "$W/states/llama_$i.safetensors" >/dev/null
done
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for engine in local ray; do
  t0=$(date +%s.%N)
  sipit invert "$W/states" --policy random -q --engine $engine --workers 2 -o "$W/$engine" | tail -1
  echo "$engine: wall $(echo "$(date +%s.%N) - $t0" | bc) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$W/$engine"
done
