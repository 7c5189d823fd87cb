#!/usr/bin/env bash
# `sipit demo` on an empty cache (the GGUF's dequantization included) by an earlier commit's code and by the working
# tree's, alternating, twice each; the earlier code from a git worktree through PYTHONPATH. From the repository root,
# the venv active:  OLD=85e62eb bash docs/results/invert/demo_ab.sh > docs/results/invert/demo_ab-NEW.txt
set -euo pipefail
tree=/tmp/sipit-demo-old
git worktree remove --force "$tree" 2> /dev/null || true
git worktree add -f --detach "$tree" "${OLD:?the earlier commit}" > /dev/null
for run in 1 2; do
  for v in "$OLD" "working tree"; do
    src=$PWD/src; [ "$v" = "$OLD" ] && src=$tree/src
    rm -rf /tmp/sipit-demo-cache /tmp/sipit-demo-out && mkdir -p /tmp/sipit-demo-out
    start=$(date +%s%N)
    PYTHONPATH=$src SIPIT_CACHE=/tmp/sipit-demo-cache python -m sipit demo --threads 2 --out /tmp/sipit-demo-out 2>/dev/null |
        grep -E "loaded|inversion:|recovered"
    echo "$v, run $run: sipit demo wall $(( ($(date +%s%N) - start) / 1000000 )) ms load $(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%T)"
  done
done
rm -rf /tmp/sipit-demo-cache /tmp/sipit-demo-out
git worktree remove --force "$tree"
