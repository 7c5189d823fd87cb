"""A/B of the lock-step lookahead (e56602f): the same prompts inverted in lock-step with the lookahead
split (the best candidate carries the continuation, the rest alone) and not (every candidate carries it),
alternating in one process. python lookahead_ab.py LAYER B SEED REPEATS"""
import importlib
import statistics
import sys
import time

import torch

from sipit.bench.invert import prompts, interleaved, _forward_seconds
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
S = importlib.import_module("sipit.invert.sipit")
layer, B, seed, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(2)
lm = load_model("smollm2", max_layer=layer)
data = prompts(lm, ["prose", "code", "random", "chat"], 8 if B <= 32 else B // 4, 20, seed)
ids = torch.tensor([p for _, p in data]); tap = LayerTap(lm, layer); states = tap.states(ids)
tol = tolerance_for(tap, {states.dtype})
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tol.eps)
order = interleaved(data)[:B]
eng.invert_prompts([states[i] for i in order[:2]])
orig = S._Run
def forced(*a):
    return orig(*a[:3], False)
out = {"split": [], "plain": []}
for r in range(reps):
    for mode in ("plain", "split"):
        S._Run = orig if mode == "split" else forced
        fwd = _forward_seconds(tap, ids[order])
        t = time.perf_counter()
        res = eng.invert_prompts([states[i] for i in order], [ids[i].tolist() for i in order])
        w = time.perf_counter() - t
        assert all(x.exact for x in res)
        out[mode].append(w / fwd)
        print(mode, round(w, 3), round(fwd, 3), round(w / fwd, 2), sum(x.forward_tokens for x in res), flush=True)
print({k: round(statistics.median(v), 2) for k, v in out.items()})
