"""The true token's rank at given positions of a bench set, by the ranker's first scores without and with the LM
prior, and by the LM's next-token scores alone read off the observed previous state; whether the prompt's guesses
turn the prior on.

    python miss_ranks.py LAYER SEED PROMPT:POSITION,...        e.g. 30 293 1:1,26:3,28:16"""
import sys
from common import bench_prompts, ranker_at, smollm2
layer, seed = int(sys.argv[1]), int(sys.argv[2])
cases = [tuple(map(int, c.split(":"))) for c in sys.argv[3].split(",")]  # prompt:position
lm = smollm2()
tap, rk = ranker_at(lm, layer)
data, ids, states = bench_prompts(lm, tap, seed)
cal = rk.cal
print("has_prior", cal.has_prior, "lm_gate", cal.lm_gate, "lm_weight", cal.lm_weight)
for i, t in cases:
    target = states[i]; truth = int(ids[i, t])
    g = rk.guesses([target])[0]
    lp = rk.prior_screens(rk.context_residuals(target), lm.norm(target[:-1]).float())[1]  # the gate's: of the plain guesses
    rank = lambda s: int((s > s[truth]).sum())
    plain = rk.scores(target, t, False)
    withp = rk.scores(target, t, True)
    lm_s = rk.lm_scores(target, t)
    print(f"prompt {i} pos {t} truth {lm.decode([truth])!r}: prior on for prompt={g[1]} mean guess logp {float(lp.mean()):.2f}; rank plain {rank(plain)} with prior {rank(withp)} LM alone {rank(lm_s)}")
