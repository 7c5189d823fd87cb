"""The first guesses with the LM prior from position 1 (PRIOR_FROM = 1, as before) and from position 2 (now):
prompts with the prior on, their wrong guesses at position 1, and wrong guesses over every position of the set.

    python prior_from.py LAYER SEEDS        e.g. 30 293,307,311,313"""
import sys
from common import bench_prompts, ranker_at, smollm2
from sipit.invert.learned import ranker as ranker_mod
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = smollm2()
tap, rk = ranker_at(lm, layer)
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    out = []
    for frm in (1, 2):
        ranker_mod.PRIOR_FROM = frm
        g = rk.guesses(states)
        on = [i for i, (_, p) in enumerate(g) if p]
        wrong1 = sum(int(g[i][0][0] != ids[i, 1]) for i in on)
        wrong_all = sum(int((g[i][0] != ids[i, 1:]).sum()) for i in range(len(g)))
        out.append(f"PRIOR_FROM={frm}: prior on {len(on)}, wrong at position 1 {wrong1}, wrong in all {wrong_all}")
    print(seed, " | ".join(out))
