"""Wrong first guesses with and without the lens prior (LearnedConfig.lens_rows), any model and layer:

    python lens_guesses.py MODEL LAYER SEEDS full|fast      e.g. gemma3-270m 9 1,7 fast

Per seed and arm: wrong first guesses (ranker.guesses) on the bench prompts (10 per source) and prompts with
none, per source (wrong, prompts with none)."""
import sys, time, torch
from dataclasses import replace
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
model, layer, mode = sys.argv[1], int(sys.argv[2]), sys.argv[4]
lm = load_model(model); tap = LayerTap(lm, layer)
base = calibration_config(mode)
rk = {}
for k, c in (("lens", base), ("plain", replace(base, lens_rows=0))):
    t = time.time(); rk[k] = SipIt(lm, layer, InvertConfig(policy="learned", learned=c)).policy.ranker; print(k, "ready", round(time.time() - t, 1), "s", "gate", rk[k].cal.lens_gate, flush=True)
for seed in [int(s) for s in sys.argv[3].split(",")]:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    tids = torch.tensor([p for _, p in data]); states = [s.float() for s in tap.states(tids)]
    for k, r in rk.items():
        w = [int((g != p[1:]).sum()) for (g, _), p in zip(r.guesses(states), tids)]
        per = {}
        for (kind, _), x in zip(data, w):
            n = per.setdefault(kind, [0, 0]); n[0] += x; n[1] += x == 0
        print(f"{model} L{layer} seed {seed} {k}: wrong {sum(w)} of {len(w) * 19}, prompts with none {sum(x == 0 for x in w)}/40 {per}", flush=True)
