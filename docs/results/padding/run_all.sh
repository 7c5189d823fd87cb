# The padded-batch check on the three embedded models (docs/results/padding/README.md); JSON lines only, in
# padded-MODEL-SEED-COMMIT.jsonl.
set -e
cd "$(dirname "$0")"
commit=$(git rev-parse --short HEAD)
for args in "smollm2 1213 1,15,30 full" "gemma3-270m 1217 1,9,18 fast" "qwen2.5-coder-1.5b 1223 1,14 fast"; do
  set -- $args
  echo "# $(date -u +%H:%M) load $(cut -d' ' -f1-3 /proc/loadavg)"
  python padded_check.py "$@" 2>/dev/null | grep --line-buffered '^{' | tee "padded-$1-$2-$commit.jsonl"
done
echo "# $(date -u +%H:%M) load $(cut -d' ' -f1-3 /proc/loadavg)"
