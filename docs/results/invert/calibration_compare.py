"""A calibration fitted by the current code against the one the cache holds (fitted by an earlier commit with
the same key), and the wrong first guesses of each on the seed-5 bench prompts (10 per source):

    python calibration_compare.py LAYERS        e.g. 15,30 (full calibrations; the fresh fit is not saved)

Prints the fitting seconds of the layers together, and per layer P's relative difference, gain, screen rank,
lens gate and the wrong guesses of 760 by each."""
import sys
import time

import torch

from sipit.bench.invert import prompts
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.fit import calibrate_layers, load_or_calibrate
from sipit.invert.learned.ranker import LinearRanker
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
layers = [int(x) for x in sys.argv[1].split(",")]
lm, cfg = load_model("smollm2"), calibration_config("full")
cached = {L: load_or_calibrate(LayerTap(lm, L), cfg)[0] for L in layers}
t = time.perf_counter()
fresh = dict(zip(layers, calibrate_layers(lm, layers, cfg)))
print("fit", round(time.perf_counter() - t, 1), "s")
data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, 5)
ids = torch.tensor([p for _, p in data])
for L in layers:
    a, b = cached[L], fresh[L]
    print(L, "P rel diff", float((a.P - b.P).norm() / a.P.norm()), "gain", a.gain, b.gain,
          "rank", a.p_basis.shape[1], b.p_basis.shape[1], "lens gate", a.lens_gate, b.lens_gate)
    tap = LayerTap(lm, L)
    states = [s.float() for s in tap.states(ids)]
    for name, cal in (("cached", a), ("fresh", b)):
        ranker = LinearRanker(cal, tap, cfg.screen_top)
        print("  ", name, "wrong", sum(int((g != p[1:]).sum()) for (g, _), p in zip(ranker.guesses(states), ids)))
