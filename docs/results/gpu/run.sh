#!/usr/bin/env bash
# The GPU checks of issue 15, run from the repository root on a CUDA machine (torch + transformers
# installed; sipit from src/). Writes JSON and logs to ${OUT:-docs/results/gpu}.
#   bash docs/results/gpu/run.sh            # everything (about 10 minutes on one H100)
#   bash docs/results/gpu/run.sh tests      # only the cuda-marked tests
set -uo pipefail
OUT=${OUT:-docs/results/gpu}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
PY=${PY:-python3}
what=${1:-all}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
$PY -m pytest -q -p no:cacheprovider -m cuda tests/models/test_device.py tests/test_pairwise.py 2>&1 | tee "$OUT/tests-cuda.log" | tail -3
[ "$what" = tests ] && exit 0
# the pairwise engine's throughput ÷ the device's plain GEMM (fp32), n states of width d
$PY -m sipit --device cuda bench pairwise --n 200000 --d 4096 > "$OUT/pairwise.json" 2> "$OUT/pairwise.log"; tail -1 "$OUT/pairwise.log"
# Llama-3.1-8B architecture at random init (Theorem 2.2's setting), bf16: exact inversion of
# 20-token random-id prompts at layers 1, 16, 32, seconds per prompt and ratio to the forward pass
$PY -m sipit --device cuda bench invert --model random:llama-3.1-8b --precision bf16 --layers 1,16,32 \
    --kinds random --prompts ${PROMPTS:-5} --length 20 --policies learned --certify top:64 --batches ${PROMPTS:-5} \
    > "$OUT/invert-llama-3.1-8b-bf16.json" 2> "$OUT/invert-llama-3.1-8b-bf16.log"
tail -3 "$OUT/invert-llama-3.1-8b-bf16.log"
$PY - "$OUT/invert-llama-3.1-8b-bf16.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for layer, e in d["layers"].items():
    p = e["policies"]["learned"]
    print(f"L{layer}: exact {p['exact']}/{p['prompts']}, {p['seconds_per_prompt_median']} s/prompt, "
          f"ratio {p['ratio_to_forward']}, calibration {p['calibration_seconds']} s, eps {e['eps']:.3g}, "
          f"verified/position {p['candidates_verified_per_position']}, lock-step {[(b['batch'], b['exact'], b['ratio_to_batched_forward_median']) for b in p.get('lock_step', [])]}")
PY
