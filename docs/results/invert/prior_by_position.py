"""At the last layer, for prompts whose guesses turn the LM prior on: the true token's rank at positions 1-4 by the
ranker's scores without and with the prior (top-1 counts, which is better, ranks of 16 and deeper, rank sums).

    python prior_by_position.py LAYER SEEDS        e.g. 30 293,307"""
import sys, torch
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = load_model("smollm2"); tap = LayerTap(lm, layer); eng = None
rows = {1: [], 2: [], 3: [], 4: []}
for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    ids = torch.tensor([p for _, p in data]); states = tap.states(ids)
    if eng is None:
        eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
    rk = eng.policy.ranker
    for i, (k, p) in enumerate(data):
        target = states[i].float()
        if not rk.guesses([target])[0][1]: continue
        for t in (1, 2, 3, 4):
            truth = int(ids[i, t])
            a, b = rk.scores(target, t, False), rk.scores(target, t, True)
            rows[t].append((int((a > a[truth]).sum()), int((b > b[truth]).sum())))
for t, v in rows.items():
    n = len(v)
    print(f"t={t}: {n} prompts with the prior on; top-1 plain {sum(a==0 for a,_ in v)} prior {sum(b==0 for _,b in v)}; prior better {sum(b<a for a,b in v)} worse {sum(b>a for a,b in v)}; rank>=16 plain {sum(a>=16 for a,_ in v)} prior {sum(b>=16 for _,b in v)}; sum of ranks plain {sum(a for a,_ in v)} prior {sum(b for _,b in v)}")
