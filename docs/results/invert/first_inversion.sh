#!/usr/bin/env bash
# A model's first inversion at a new layer, as a user meets it: 5 captured prompts (2 prose, 2 code, 1 random ids)
# inverted with `--calibration fast` on a cache that holds only the model's weights (no calibration, no eps, no
# near-duplicates: the first layer run pays for the model's), wall seconds per layer. Run from the repository root with
# the venv active (SmolLM2 at layers 1, 15, 30 unless MODEL, WEIGHTS (its dequantized folder's pattern) and LAYERS say):
#   bash docs/results/invert/first_inversion.sh > docs/results/invert/first-inversion-smollm2-COMMIT.log
#   MODEL=gemma3-270m WEIGHTS='gemma-3-270m*' LAYERS='1 9 18' bash docs/results/invert/first_inversion.sh
set -euo pipefail
work=${WORK:-/tmp/sipit-first-inversion}
rm -rf "$work" && mkdir -p "$work/cache/dequantized"
model=${MODEL:-smollm2}
cache=${SIPIT_CACHE:-$HOME/.cache/sipit}
cp -r "$cache"/dequantized/${WEIGHTS:-SmolLM2*} "$work/cache/dequantized/"  # (sipit loads the current one)
# a multi-part model's GGUF is assembled into the cache, and its dequantized copy is keyed by that file's path: the
# work cache links to the same folder, or its first layer would assemble and dequantize the model again
[ -d "$cache/gguf" ] && ln -s "$(realpath "$cache/gguf")" "$work/cache/gguf"
code=$(python -c "import pathlib, sipit; print(pathlib.Path(sipit.__file__).parent)")  # (PYTHONPATH may name another checkout)
echo "$model: commit $(git -C "$code" rev-parse --short HEAD) $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
for L in ${LAYERS:-1 15 30}; do
    SIPIT_CACHE=$work/cache python -m sipit capture --model $model --layer $L --corpus prose:2,code:2,random:1 \
        -o "$work/s$L.safetensors" > /dev/null 2>&1
    start=$(date +%s%N)
    SIPIT_CACHE=$work/cache python -m sipit invert "$work/s$L.safetensors" --calibration fast -o "$work/r$L" 2>/dev/null
    echo "layer $L wall $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
rm -rf "$work"
