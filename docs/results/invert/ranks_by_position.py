"""The true token's rank in the ranker's first scores (no anchors; the prior as the prompt's guesses gate it) at
positions 1, 2, 3 and 4-19 of bench sets: median, 90th percentile, largest, how many at 256 or deeper, top-1 share.

    python ranks_by_position.py LAYER SEEDS        e.g. 30 293,307"""
import sys
from common import bench_prompts, ranker_at, smollm2
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = smollm2()
tap, rk = ranker_at(lm, layer)
by = {}
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    for i, target in enumerate(states):
        prior = rk.guesses([target])[0][1]
        for t in range(1, 20):
            s = rk.scores(target, t, prior)
            r = int((s > s[int(ids[i, t])]).sum())
            b = str(t) if t <= 3 else "4-19"
            by.setdefault(b, []).append(r)
for b, v in by.items():
    v = sorted(v); n = len(v)
    print(f"pos {b:5s} n={n:4d} median {v[n//2]:5d} p90 {v[int(n*.9)]:6d} max {v[-1]:6d} rank>=256 {sum(x>=256 for x in v)} ({100*sum(x>=256 for x in v)/n:.1f}%) top1 {sum(x==0 for x in v)/n:.2f}")
