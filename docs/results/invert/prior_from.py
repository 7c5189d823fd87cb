"""The first guesses with the LM prior from position 1 (PRIOR_FROM = 1, as before) and from position 2 (now):
prompts with the prior on, their wrong guesses at position 1, and wrong guesses over every position of the set.

    python prior_from.py LAYER SEEDS        e.g. 30 293,307,311,313"""
import sys, torch
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned import ranker as ranker_mod
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = load_model("smollm2"); tap = LayerTap(lm, layer); eng = None
for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    ids = torch.tensor([p for _, p in data]); states = tap.states(ids)
    if eng is None:
        eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
    rk = eng.policy.ranker
    out = []
    for frm in (1, 2):
        ranker_mod.PRIOR_FROM = frm
        g = rk.guesses([s.float() for s in states])
        on = [i for i, (_, p) in enumerate(g) if p]
        wrong1 = sum(int(g[i][0][0] != ids[i, 1]) for i in on)
        wrong_all = sum(int((g[i][0] != ids[i, 1:]).sum()) for i in range(len(g)))
        out.append(f"PRIOR_FROM={frm}: prior on {len(on)}, wrong at position 1 {wrong1}, wrong in all {wrong_all}")
    print(seed, " | ".join(out))
