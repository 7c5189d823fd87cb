#!/usr/bin/env bash
# A fast calibration of SmolLM2 at one layer by this checkout's code ("new") and by another's ("old", its src
# directory, e.g. a `git worktree add /tmp/old COMMIT`), alternating, each on a cache holding only the dequantized
# weights; prints sipit calibrate's JSON per run. With the venv active:
#   bash docs/results/invert/fast_calibration_ab.sh LAYER OLD_SRC [RUNS]
set -euo pipefail
layer=$1; old=$2; runs=${3:-2}
new=$(cd "$(dirname "$0")/../../.." && pwd)/src
work=$(mktemp -d)
for i in $(seq "$runs"); do
    for side in new old; do
        rm -rf "$work/cache" && mkdir -p "$work/cache/dequantized"
        cp -r "${SIPIT_CACHE:-$HOME/.cache/sipit}"/dequantized/SmolLM2* "$work/cache/dequantized/"
        src=$new; [ "$side" = old ] && src=$old
        out=$(cd "$work" && PYTHONPATH=$src SIPIT_CACHE=$work/cache python -m sipit calibrate --model smollm2 \
            --layers "$layer" --calibration fast --threads 2 2>/dev/null | tail -1)
        echo "$side $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) $out"
    done
done
rm -rf "$work"
