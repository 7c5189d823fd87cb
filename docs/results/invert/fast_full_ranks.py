"""Where the fast and the full calibration's linear model rank the true token (plain scores, no prior, no anchors) at
every position t >= 1 of a seed's bench prompts, by source: how often first, the median and 90th percentile rank, how
many ranked 80th or worse (a search's third batch). SmolLM2, the calibrations cached or fitted.

    python fast_full_ranks.py LAYER SEED        e.g. 30 1063"""
import math
import statistics
import sys

from common import bench_prompts, ranker_at, smollm2

layer, seed = int(sys.argv[1]), int(sys.argv[2])
lm = smollm2()
for mode in ("full", "fast"):
    tap, ranker = ranker_at(lm, layer, mode)
    data, ids, states = bench_prompts(lm, tap, seed, 10)
    ranks = {}
    for (source, _), x, s in zip(data, ids, states):
        for t in range(1, len(x)):
            scores = ranker.scores(s, t, False)
            ranks.setdefault(source, []).append(int((scores > scores[int(x[t])]).sum()))
    for source, r in ranks.items():
        r = sorted(r)
        print(f"layer {layer} {mode} {source:6s}: first {sum(a == 0 for a in r)}/{len(r)}, median {statistics.median(r)}, "
              f"90th percentile {r[int(.9 * len(r))]}, 80th or worse {sum(a >= 80 for a in r)}, mean log2(1 + rank) "
              f"{statistics.mean(math.log2(1 + a) for a in r):.2f}", flush=True)
