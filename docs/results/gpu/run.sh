#!/usr/bin/env bash
# The GPU checks of issues 15 and 14, run from the repository root on a CUDA machine (torch + transformers
# installed; sipit from src/). Writes logs and JSON to ${OUT:-docs/results/gpu} (8 files at most).
#   bash docs/results/gpu/run.sh tests    # every cuda-marked test and the pairwise engine (about a minute)
#   bash docs/results/gpu/run.sh layer1   # random:llama-3.1-8b, bf16, layer 1: search passes of 256 candidates
#                                         # (the CPU's) against the GPU's default (4,096), same prompts
#   bash docs/results/gpu/run.sh deep     # layers 16 and 32 with the GPU's default
#   bash docs/results/gpu/run.sh long     # long_prefix.py: passes sized by free memory where the size binds
#                                         # (prefixes of 160-2,048 tokens), then one 160-token prompt, 240 s
#   bash docs/results/gpu/run.sh calibrate  # calibrate_all.py: every layer's fast calibration in as few passes as fit
#                                         # the GPU's memory, seconds per layer per billion parameters, load seconds
#   bash docs/results/gpu/run.sh passes     # pass_tokens_ab.py: shared passes of 1,024 vs 4,096 new tokens (a full
#                                         # certificate, 8 prompts in lock-step), same results
#   bash docs/results/gpu/run.sh          # all but long, calibrate and passes (more than one 10-minute device call: run the parts)
# Each inversion run stops after ${CAP:-240} s; --progress prints a line per prompt as it finishes, so a
# stopped run still shows its finished prompts. ${PROMPTS:-3} 20-token random-id prompts per run.
set -uo pipefail
OUT=${OUT:-docs/results/gpu}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
PY=${PY:-python3}
what=${1:-all}
mkdir -p "$OUT"

invert() {  # invert NAME [bench options]: $OUT/invert-NAME.txt holds the progress lines, then the JSON
    timeout "${CAP:-240}" $PY -m sipit --device cuda bench invert --model random:llama-3.1-8b --precision bf16 \
        --kinds random --prompts "${PROMPTS:-3}" --length 20 --policies learned --certify "" --batches "" \
        --progress "${@:2}" > "$OUT/invert-$1.txt" 2>> "$OUT/run.log"
    echo "invert-$1: exit $?"
    $PY - "$OUT/invert-$1.txt" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
lines = [l for l in text.splitlines() if l.startswith("L")]
print("\n".join(lines))
if "\n{" in "\n" + text:
    d = json.loads(text[text.index("{"):])
    for layer, e in d["layers"].items():
        p = e["policies"]["learned"]
        print(f"L{layer}: exact {p['exact']}/{p['prompts']}, ok {p['ok']}, {p['seconds_per_prompt_median']} s/prompt, "
              f"ratio {p['ratio_to_forward']}, calibration {p['calibration_seconds']} s, eps {e['eps']:.3g} "
              f"(noise {e['noise']:.3g}), verified/position {p['candidates_verified_per_position']}, "
              f"tap calls/prompt {p['tap_calls_per_prompt']}")
PY
}

if [ "$what" = tests ] || [ "$what" = all ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
        | tee -a "$OUT/device.txt"
    # (test_engines.py needs Ray, which GPU machines lack; it has no cuda-marked test)
    $PY -m pytest -q -p no:cacheprovider -m cuda tests --ignore=tests/test_engines.py 2>&1 \
        | tee "$OUT/tests-cuda.log" | tail -3
    # the pairwise engine's throughput ÷ the device's plain GEMM (fp32), n states of width d
    $PY -m sipit --device cuda bench pairwise --n 200000 --d 4096 > "$OUT/pairwise.json" 2>> "$OUT/run.log"
    tail -1 "$OUT/run.log"
fi
# Llama-3.1-8B's architecture at random initialisation (Theorem 2.2's setting), bf16: exact inversion of
# random-id prompts; seconds per prompt and ratio to the forward pass
if [ "$what" = layer1 ] || [ "$what" = all ]; then
    invert L1-b256 --layers 1 --batch-size 256
    invert L1 --layers 1
fi
if [ "$what" = deep ] || [ "$what" = all ]; then
    invert L16 --layers 16
    invert L32 --layers 32
fi
if [ "$what" = long ]; then
    timeout 340 $PY docs/results/gpu/long_prefix.py "$OUT/long_prefix.json" 2>&1 | tee "$OUT/long_prefix.txt"
fi
if [ "$what" = calibrate ]; then
    timeout "${CAP:-240}" $PY docs/results/gpu/calibrate_all.py "$OUT/calibrate_all.json" 2>&1 | tee "$OUT/calibrate_all.txt"
fi
if [ "$what" = passes ]; then
    timeout "${CAP:-240}" $PY docs/results/gpu/pass_tokens_ab.py "$OUT/pass_tokens_ab.json" 2>&1 | tee "$OUT/pass_tokens_ab.txt"
fi
