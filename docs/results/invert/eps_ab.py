"""The same prompts inverted with two ε (eps v4's and v5's measured values, say): every other bench prompt of a seed,
one at a time, alternating, each exact and `ok`; per ε the full-length rechecks (a search's nearest candidate within
NEAR·ε but not ε), the passes and the median seconds. A looser ε accepts nothing new (every token is still the
nearest and certified), but NEAR·ε grows with it.

    python eps_ab.py LAYER SEED EPS,EPS        e.g. 30 1033 2.16e-4,6.44e-4"""
import statistics
import sys
import time

import common

from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

layer, seed, epss = int(sys.argv[1]), int(sys.argv[2]), [float(x) for x in sys.argv[3].split(",")]
lm = common.smollm2()
tap = LayerTap(lm, layer)
data, ids, states = common.bench_prompts(lm, tap, seed)
engines = {e: SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=e) for e in epss}
rechecks, passes, seconds = ({e: 0 for e in epss}, {e: 0 for e in epss}, {e: [] for e in epss})
for e, engine in engines.items():
    engine.invert_prompt(states[0], ids[0].tolist())  # warm-up
    full_length = engine._full_length

    def counted(*args, e=e, f=full_length, **kw):
        rechecks[e] += 1
        return f(*args, **kw)
    engine._full_length = counted
for i in range(1, len(states), 2):
    for e, engine in engines.items():
        t = time.perf_counter()
        r = engine.invert_prompt(states[i], ids[i].tolist())
        seconds[e].append(time.perf_counter() - t)
        assert r.exact and r.status == "ok", (e, i, r.status)
        passes[e] += r.tap_calls
for e in epss:
    print(f"SmolLM2 layer {layer}, {len(seconds[e])} bench prompts of seed {seed}, eps {e:.3g}: full-length rechecks "
          f"{rechecks[e]}, passes {passes[e]}, median {statistics.median(seconds[e]):.3f} s a prompt", flush=True)
