"""The true token's rank in the ranker's first scores (no anchors; the prior as the prompt's guesses gate it) at
positions 1, 2, 3 and 4-19 of bench sets: median, 90th percentile, largest, how many at 256 or deeper, top-1 share.

    python ranks_by_position.py LAYER SEEDS        e.g. 30 293,307"""
import sys, torch, statistics
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = load_model("smollm2"); tap = LayerTap(lm, layer); eng = None
by = {}
for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    ids = torch.tensor([p for _, p in data]); states = tap.states(ids)
    if eng is None:
        eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
    rk = eng.policy.ranker
    for i, (k, p) in enumerate(data):
        target = states[i].float()
        prior = rk.guesses([target])[0][1]
        for t in range(1, 20):
            s = rk.scores(target, t, prior)
            r = int((s > s[int(ids[i, t])]).sum())
            b = str(t) if t <= 3 else "4-19"
            by.setdefault(b, []).append(r)
for b, v in by.items():
    v = sorted(v); n = len(v)
    print(f"pos {b:5s} n={n:4d} median {v[n//2]:5d} p90 {v[int(n*.9)]:6d} max {v[-1]:6d} rank>=256 {sum(x>=256 for x in v)} ({100*sum(x>=256 for x in v)/n:.1f}%) top1 {sum(x==0 for x in v)/n:.2f}")
