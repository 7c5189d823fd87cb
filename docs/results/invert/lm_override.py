"""At the last layer, would trusting the LM where it is confident fix wrong first guesses? For the bench prompts
whose guesses take the LM prior (the calibration's gate), each position's guess (ranker.guesses) is replaced by the
LM's own top-1 (from the observed ĥ_{t-1}) where that token's probability exceeds θ; prints wrong first guesses
of the text prompts and prompts with none, per θ (θ = 1: the current guesses). Choose θ on the tuning seed (5),
read it on held-out ones.

    python lm_override.py SEEDS THETAS      e.g. 5 0.5,0.7,0.9,0.97,1"""
import sys

import torch

from common import bench_prompts, ranker_at, smollm2

seeds, thetas = [int(s) for s in sys.argv[1].split(",")], [float(x) for x in sys.argv[2].split(",")]
lm = smollm2()
tap, rk = ranker_at(lm, lm.depth)
for seed in seeds:
    data, ids, S = bench_prompts(lm, tap, seed)
    guesses = rk.guesses(S)
    for theta in thetas:
        wrong = none = on = 0
        for (kind, _), p, s, (g, prior) in zip(data, ids, S, guesses):
            if not prior:
                continue
            on += 1
            probs = torch.softmax(rk.unembed @ rk.normed(s[:-1]).float().T, 0)  # [V, T-1]
            top_p, top = probs.max(0)
            g = torch.where(top_p > theta, top, g)
            k = int((g != p[1:]).sum())
            wrong, none = wrong + k, none + (k == 0)
        print(f"seed {seed} θ {theta}: prompts with the prior on {on}, wrong first guesses {wrong}, prompts with none {none}",
              flush=True)
