"""How often a searched position's true token is an induction candidate: a token that followed an earlier occurrence
of the previous token in the verified prefix (repeated text: 'un' -> 'forgettable' again). Bench prompts one at a
time; searches grouped by candidates tried (shallow <= 2, mid < 80, deep >= 80).

    python induction_candidates.py LAYER SEEDS      e.g. 15 139,149,151,157,163,167,173,191,199"""
import sys, torch, collections
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
torch.set_num_threads(2)
lm = load_model("smollm2"); tap = LayerTap(lm, layer); eng = None
stats = collections.Counter()
for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    ids = torch.tensor([p for _, p in data]); states = tap.states(ids)
    if eng is None:
        eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
    for i in range(len(ids)):
        r = eng.invert_prompt(states[i], ids[i].tolist())
        x = ids[i].tolist()
        for t, q in enumerate(r.positions):
            if t < 2 or q.via == "speculation":
                continue
            prev = x[t - 1]
            ind = [x[s + 1] for s in range(t - 1) if x[s] == prev]
            hit = x[t] in ind
            key = "deep" if q.tried >= 80 else ("mid" if q.tried > 2 else "shallow")
            stats[(key, "searches")] += 1; stats[(key, "in induction set")] += hit; stats[(key, "has induction set")] += bool(ind)
            stats[(key, "tried total")] += q.tried; stats[(key, "tried when hit")] += q.tried if hit else 0
print(layer, seeds, dict(sorted(stats.items())))
