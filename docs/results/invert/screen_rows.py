"""The guesses of a lock-step batch (32 bench prompts of seed 5, 608 positions) against SCREEN_ROWS, the rows per
screening product: screen_best alone and the whole ranker.guesses, medians of 7, at layers 1 and 15.
    python screen_rows.py"""
import time, statistics, torch, sys
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned import ranker as R
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
lm = load_model("smollm2")
for layer in (1, 15):
    tap = LayerTap(lm, layer)
    ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 8, 20, 5)])
    S = [s.float() for s in tap.states(ids)]
    rk = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=1e-4).policy.ranker
    r = rk.context_residuals(*S)
    for rows in (16, 32, 64, 128, 256):
        R.SCREEN_ROWS = rows
        xs = []
        for _ in range(7):
            t = time.perf_counter(); rk.screen_best(r); xs.append(time.perf_counter() - t)
        ys = []
        for _ in range(7):
            t = time.perf_counter(); rk.guesses(S); ys.append(time.perf_counter() - t)
        print(f"layer {layer} rows {rows}: screen_best of {len(r)} {statistics.median(xs)*1e3:.1f} ms, guesses {statistics.median(ys)*1e3:.1f} ms", flush=True)
