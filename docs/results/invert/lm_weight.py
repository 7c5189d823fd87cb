"""Wrong first guesses (ranker.guesses) and prompts with none at the last layer for several LM-prior weights
(Calibration.lm_weight, 5 by default), on the bench prompts.
    python lm_weight.py LAYER SEEDS WEIGHTS        e.g. 30 5 3,5,7.5,10,15"""
import sys
from common import bench_prompts, ranker_at, smollm2
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]; weights = [float(x) for x in sys.argv[3].split(",")]
lm = smollm2(); tap, rk = ranker_at(lm, layer)
w0 = rk.cal.lm_weight; print("calibrated weight", w0, "gate", rk.cal.lm_gate)
for seed in seeds:
    data, tids, states = bench_prompts(lm, tap, seed)
    for w in weights:
        rk.cal.lm_weight = w
        per = {}
        for (kind, _), (g, on), p in zip(data, rk.guesses(states), tids):
            x = int((g != p[1:]).sum()); n = per.setdefault(kind, [0, 0]); n[0] += x; n[1] += x == 0
        print(f"seed {seed} w {w}: wrong {sum(v[0] for v in per.values())}, none {sum(v[1] for v in per.values())}/40 {per}", flush=True)
    rk.cal.lm_weight = w0
