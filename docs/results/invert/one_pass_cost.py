"""What a prompt inverted in one pass costs, one at a time, against a forward of it timed right before:

    python one_pass_cost.py LAYER SEED [SORT]     e.g. 15 1, or 1 5 tottime

The bench prompts (10 per source) three times each; medians of the ratio, of its passes, and the milliseconds,
for the prompts that needed one pass and for the others; then cProfile of the one-pass prompts (sorted by SORT,
default cumulative)."""
import cProfile
import pstats
import statistics
import sys
import time

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

layer, seed = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(2)
lm = load_model("smollm2")
ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)])
tap = LayerTap(lm, layer)
states = tap.states(ids)
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
            eps=tolerance_for(tap, {states.dtype}).eps)
for i in range(4):
    eng.invert_prompt(states[i])
one, more = [], []
for rep in range(3):
    for i in range(len(ids)):
        t = time.perf_counter()
        tap.states(ids[i])
        forward = time.perf_counter() - t
        t = time.perf_counter()
        r = eng.invert_prompt(states[i], ids[i].tolist())
        seconds = time.perf_counter() - t
        assert r.exact and r.status == "ok"
        (one if r.tap_calls == 1 else more).append((seconds / forward, r.pass_seconds / forward, seconds * 1e3, forward * 1e3))
for name, rows in (("one pass", one), ("more", more)):
    med = [round(statistics.median(x[k] for x in rows), 3) for k in range(4)]
    print(f"{name}: {len(rows) // 3} prompts, ratio {med[0]}, of it passes {med[1]}, {med[2]} ms, forward {med[3]} ms")
single = [i for i in range(len(ids)) if eng.invert_prompt(states[i]).tap_calls == 1]
profile = cProfile.Profile()
profile.enable()
for i in single:
    eng.invert_prompt(states[i], ids[i].tolist())
profile.disable()
pstats.Stats(profile).sort_stats(sys.argv[3] if len(sys.argv) > 3 else "cumulative").print_stats(45)
