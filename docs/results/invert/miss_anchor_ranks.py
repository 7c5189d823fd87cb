"""The true token's rank at each position of the bench prompts of seeds (10 a source, 20 tokens), per source: under the
loop's first score (context predicted from the observed previous state, the prior as gated), and at positions whose
first guess is wrong, under the anchored score with that guess's exact state on the true prefix as its one anchor (what
a search after the miss first ranks by). Nothing inverted.

    python miss_anchor_ranks.py LAYER SEEDS        e.g. 30 1"""
import sys

import torch

from common import SOURCES, bench_prompts, ranker_at, smollm2

layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = smollm2()
tap, rk = ranker_at(lm, layer)
res = {k: {"plain": [], "anch": []} for k in SOURCES}
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    for (kind, p), s in zip(data, states):
        p = torch.tensor(p)
        (g, prior), = rk.guesses([s])
        for t in range(1, len(p)):
            sc = rk.scores(s, t, prior)
            rank = int((sc > sc[p[t]]).sum())
            res[kind]["plain"].append(rank)
            if g[t - 1] != p[t]:
                ctx = torch.cat([p[:t], g[t - 1:t]])
                h = tap.states(ctx[None])[0][-1:].float()
                sa = rk.scores(s, t, prior, (g[t - 1:t], h))
                res[kind]["anch"].append(int((sa > sa[p[t]]).sum()))


def shares(ranks: list[int]) -> str:
    x = torch.tensor(ranks)
    return f"n {len(x)} " + " ".join(f"top{k} {(x < k).float().mean():.2f}" for k in (1, 4, 16, 64))


for k, v in res.items():
    print(k, "plain:", shares(v["plain"]), "| anchored, after a miss:", shares(v["anch"]))
