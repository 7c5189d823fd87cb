#!/usr/bin/env bash
# The exact commands of the 2026-11-23 14:32-16:11 rerun (commit 6195517), on hard links of acceptance.sh's
# captured files in /tmp/runs/s2/<model>; the states-int8row-L30 file was stopped for time, and Gemma-3's
# projections then ran with --max-seconds 30 (k64 L1/L9/L18, k16 L1, k4 L1). Kept as the record of the run.
cd /work/main
S() { .venv/bin/python -m sipit --threads 2 invert -q --max-seconds 120 "$@" 2>&1 | grep -v Warning; }
G=/tmp/runs/s2/gemma3-270m; M=/tmp/runs/s2/smollm2
date; S $G/kv-values-L1.safetensors $G/kv-values-L9.safetensors $G/kv-values-L18.safetensors $G/kv-keys-L9.safetensors
date; S $M/kv-keys-L1.safetensors $M/kv-values-L1.safetensors $M/kv-both-L1.safetensors $M/kv-keys-L15.safetensors $M/kv-values-L15.safetensors $M/kv-both-L15.safetensors $M/kv-keys-L30.safetensors $M/kv-values-L30.safetensors $M/kv-both-L30.safetensors
date; S $G/logits.safetensors $G/logprobs.safetensors
date; S $M/logits.safetensors $M/logprobs.safetensors
date; S $M/proj-gaussian-k64-L1.safetensors $M/proj-gaussian-k64-L15.safetensors $M/proj-gaussian-k64-L30.safetensors $M/proj-gaussian-k16-L1.safetensors $M/proj-gaussian-k16-L15.safetensors $M/proj-gaussian-k16-L30.safetensors $M/proj-gaussian-k4-L1.safetensors
date; S $M/states-fp8-L1.safetensors $M/states-int8row-L1.safetensors $M/states-fp8-L15.safetensors $M/states-int8row-L15.safetensors $M/states-fp8-L30.safetensors $M/states-int8row-L30.safetensors
date; S $G/proj-gaussian-k64-L1.safetensors $G/proj-gaussian-k64-L9.safetensors $G/proj-gaussian-k64-L18.safetensors $G/proj-gaussian-k16-L1.safetensors $G/proj-gaussian-k16-L9.safetensors $G/proj-gaussian-k16-L18.safetensors $G/proj-gaussian-k4-L1.safetensors
date; echo done
