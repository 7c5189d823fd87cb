# The padded-batch check on the three embedded models (docs/results/padding/README.md); JSON lines only.
set -e
cd "$(dirname "$0")"
# (Qwen2.5-Coder-1.5B at layer 1 only, without the unmasked run: 15 sweeps of its 151,936 tokens)
for args in "smollm2 1151 1,15,30 full" "gemma3-270m 1153 1,9,18 fast" "qwen2.5-coder-1.5b 1163 1 fast no"; do
  set -- $args
  echo "# $(date -u +%H:%M) load $(cut -d' ' -f1-3 /proc/loadavg)"
  python padded_check.py "$@" 2>/dev/null | grep --line-buffered '^{' | tee "padded-$1-$2.jsonl"
done
echo "# $(date -u +%H:%M) load $(cut -d' ' -f1-3 /proc/loadavg)"
