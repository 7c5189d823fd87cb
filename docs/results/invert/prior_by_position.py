"""At the last layer, for prompts whose guesses turn the LM prior on: the true token's rank at positions 1-4 by the
ranker's scores without and with the prior (top-1 counts, which is better, ranks of 16 and deeper, rank sums).

    python prior_by_position.py LAYER SEEDS        e.g. 30 293,307"""
import sys
from common import bench_prompts, ranker_at, smollm2
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = smollm2()
tap, rk = ranker_at(lm, layer)
rows = {1: [], 2: [], 3: [], 4: []}
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    for i, target in enumerate(states):
        if not rk.guesses([target])[0][1]: continue
        for t in (1, 2, 3, 4):
            truth = int(ids[i, t])
            a, b = rk.scores(target, t, False), rk.scores(target, t, True)
            rows[t].append((int((a > a[truth]).sum()), int((b > b[truth]).sum())))
for t, v in rows.items():
    n = len(v)
    print(f"t={t}: {n} prompts with the prior on; top-1 plain {sum(a==0 for a,_ in v)} prior {sum(b==0 for _,b in v)}; prior better {sum(b<a for a,b in v)} worse {sum(b>a for a,b in v)}; rank>=16 plain {sum(a>=16 for a,_ in v)} prior {sum(b>=16 for _,b in v)}; sum of ranks plain {sum(a for a,_ in v)} prior {sum(b for _,b in v)}")
