#!/usr/bin/env bash
# A first inversion (first_inversion.sh: fresh caches, 5 prompts, `--calibration fast`) by an earlier commit's code and
# by the working tree's, alternating, twice each; the earlier code runs from a git worktree through PYTHONPATH. Run
# from the repository root with the venv active (LAYERS, MODEL and WEIGHTS as first_inversion.sh takes them):
#   OLD=85e62eb LAYERS=15 bash docs/results/invert/first_inversion_ab.sh > docs/results/invert/first_inversion_ab-15-NEW.txt
set -euo pipefail
old=${OLD:?the earlier commit}
tree=/tmp/sipit-first-inversion-old
git worktree remove --force "$tree" 2> /dev/null || true
git worktree add -f --detach "$tree" "$old" > /dev/null
for run in 1 2; do
    for code in "$old" "working tree"; do
        echo "== $code, run $run"
        src=$([ "$code" = "$old" ] && echo "$tree/src" || echo "$PWD/src")
        PYTHONPATH=$src bash "$(dirname "$0")/first_inversion.sh"
    done
done
git worktree remove --force "$tree"
