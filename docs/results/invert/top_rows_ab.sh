#!/usr/bin/env bash
# The bench (layers 1 and 15, lock-step 8 and 32) with the code before top_rows (BASE, a worktree) and with the
# current code, one after the other in separate processes, per seed: top_rows_ab-{old,new}-seedS[-TAG].json here.
# Run from the repository root with the venv active:  bash docs/results/invert/top_rows_ab.sh f5a5e84 7 [TAG]
set -euo pipefail
base=$1 seed=$2 tag=${3:+-$3}
wt=${WT:-/tmp/sipit-top-rows-base}
[ -d "$wt" ] || git worktree add -f "$wt" "$base" > /dev/null
for v in old new; do
    src=$PWD/src; [ $v = old ] && src=$wt/src
    echo "$v $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$src python -m sipit bench invert --model smollm2 --policies learned --kinds prose,code,random,chat \
        --prompts 10 --length 20 --batches 8,32 --certify "" --threads 2 --layers 1,15 --seed "$seed" \
        > docs/results/invert/top_rows_ab-$v-seed$seed$tag.json 2> /dev/null
done
