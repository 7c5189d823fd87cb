"""Do the ranker's margins point at its wrong first guesses? The bench prompts of a seed (10 a source, 20 tokens), each
position's first guess (ranker.first_look) right or wrong, and the gap between the best and second-best score
(ranker.scores); the share of the wrong guesses among the positions of smallest gap.

    python guess_margins.py LAYER SEED        e.g. 15 1069"""
import sys

import torch

from common import bench_prompts, ranker_at, smollm2

layer, seed = int(sys.argv[1]), int(sys.argv[2])
lm = smollm2()
tap, ranker = ranker_at(lm, layer)
data, ids, states = bench_prompts(lm, tap, seed)
wrong, gap = [], []
for (_, p), target, (guess, prior, _) in zip(data, states, ranker.first_look(states)):
    for t in range(1, len(p)):
        best = ranker.scores(target, t, prior).topk(2).values
        wrong.append(int(guess[t - 1]) != p[t])
        gap.append(float(best[0] - best[1]))
wrong, gap = torch.tensor(wrong), torch.tensor(gap)
print(f"layer {layer}, seed {seed}: {int(wrong.sum())} wrong first guesses of {len(wrong)} positions")
order = gap.argsort()
for share in (0.02, 0.05, 0.1, 0.2, 0.3):
    k = int(share * len(gap))
    print(f"  the {share:.0%} of positions with the smallest gap ({k}) hold {int(wrong[order[:k]].sum())} of them")
q = torch.tensor([0.1, 0.5, 0.9])
print("  gap quantiles (10 / 50 / 90%): wrong", [round(float(x), 1) for x in gap[wrong].quantile(q)],
      "right", [round(float(x), 1) for x in gap[~wrong].quantile(q)])
