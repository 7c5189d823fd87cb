"""Where the first guesses go wrong: per source, the bench prompts' wrong first guesses (positions 1-19) and how many of
them had the truth in the ranker's best 16 / 64 (its scores without anchors, the prior as the guesses gate it).

    python wrong_guess_ranks.py LAYER SEEDS        e.g. 30 683,691"""
import sys, torch, time
from common import smollm2, ranker_at, bench_prompts
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]
lm = smollm2(); tap, rk = ranker_at(lm, layer)
from collections import defaultdict
stat = defaultdict(lambda: [0, 0, 0, 0, 0])  # positions, wrong, truth rank<16, <64, prior on prompts
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    for (src, p), target in zip(data, states):
        g, prior = rk.guesses([target])[0]
        s = stat[src]
        s[4] += prior
        for t in range(1, 20):
            s[0] += 1
            if int(g[t - 1]) != p[t]:
                s[1] += 1
                sc = rk.scores(target, t, prior)
                rank = int((sc > sc[p[t]]).sum())
                s[2] += rank < 16; s[3] += rank < 64
for src, s in stat.items():
    print(src, "positions", s[0], "wrong", s[1], "truth rank<16", s[2], "<64", s[3], "prior-on prompts", s[4])
