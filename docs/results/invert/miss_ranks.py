"""The true token's rank at given positions of a bench set, by the ranker's first scores without and with the LM
prior, and by the LM's next-token scores alone read off the observed previous state; whether the prompt's guesses
turn the prior on.

    python miss_ranks.py LAYER SEED PROMPT:POSITION,...        e.g. 30 293 1:1,26:3,28:16"""
import sys, torch
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer, seed = int(sys.argv[1]), int(sys.argv[2])
cases = [tuple(map(int, c.split(":"))) for c in sys.argv[3].split(",")]  # prompt:position
lm = load_model("smollm2"); tap = LayerTap(lm, layer)
data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
ids = torch.tensor([p for _, p in data]); states = tap.states(ids)
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
rk = eng.policy.ranker; cal = rk.cal
print("has_prior", cal.has_prior, "lm_gate", cal.lm_gate, "lm_weight", cal.lm_weight)
for i, t in cases:
    target = states[i].float(); truth = int(ids[i, t])
    g = rk.guesses([target])[0]
    lp = rk.lm_logprobs([target], [g[0]])[0]
    rank = lambda s: int((s > s[truth]).sum())
    plain = rk.scores(target, t, False)
    withp = rk.scores(target, t, True)
    lm_s = rk.lm_scores(target, t)
    print(f"prompt {i} pos {t} truth {lm.decode([truth])!r}: prior on for prompt={g[1]} mean guess logp {float(lp.mean()):.2f}; rank plain {rank(plain)} with prior {rank(withp)} LM alone {rank(lm_s)}")
