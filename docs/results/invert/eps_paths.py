"""Position 1's recomputation noise by the pass that cached position 0, and what eps.measure_noise measures: the
token after each of the sink measurement's common first tokens (eps.sink_pairs), recomputed on
a prefix of position 0 made by a one-token pass of its own (what measure_noise used before v5), by the pair's own
speculation row (a prompt alone), or by one pass of every pair as rows (a lock-step round), then extended alone or,
lock-step, all in one pass of each layout; relative to one full forward of the pair. Then measure_noise as at
BEFORE (its eps.py) and as now, alternating, twice each: seconds, the largest noise and ε = 50 × it.

    python eps_paths.py MODEL LAYERS BEFORE        e.g. smollm2 1,15,30 1564c22"""
import subprocess
import sys
import time
import types

import torch

from sipit.invert.eps import measure_noise, sink_pairs
from sipit.invert.verify import rel_distance
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
model, layers, before = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]
source = subprocess.check_output(["git", "show", f"{before}:src/sipit/invert/eps.py"], text=True)
old = types.ModuleType("sipit.invert.eps_before")
old.__package__ = "sipit.invert"
sys.modules[old.__name__] = old
exec(compile(source, f"eps.py@{before}", "exec"), old.__dict__)

lm = load_model(model)
pairs = sink_pairs(lm, torch.Generator().manual_seed(0))  # [n, 2]: the pairs measure_noise measures
for layer in layers:
    tap = LayerTap(lm, layer)
    ref = tap.states(pairs)[:, 1]  # [n, d]
    empty = tap.prefill(pairs[:0, 0])
    own = [tap.extend(tap.prefill(p[:1]), p[1:])[0] for p in pairs]
    row = [tap.extend(tap.extend(empty, p[None], keep=True)[1](0, 1), p[1:])[0] for p in pairs]
    _, grown = tap.extend(empty, pairs, keep=True)
    prefixes = [grown(b, 1) for b in range(len(pairs))]
    alone = [tap.extend(q, p[1:])[0] for q, p in zip(prefixes, pairs)]
    requests = [(q, p[None, 1:]) for q, p in zip(prefixes, pairs)]
    many = {layout: [h[0, 0] for h, _ in tap.extend_many(requests, layout=layout)] for layout in ("padded", "flat")}
    paths = {"own one-token pass": own, "its speculation row": row, "lock-step prefix, alone": alone,
             "lock-step, padded": many["padded"], "lock-step, flat": many["flat"]}
    print(f"{model} layer {layer}, position 1 after {len(pairs)} first tokens, largest (median) relative noise by "
          "the pass that cached position 0:")
    for name, states in paths.items():
        d = rel_distance(torch.stack(states), ref)
        print(f"  {name:26s} {float(d.max()):.3g} ({float(d.median()):.2g})")
    runs = {}
    for name, module in (("before", old), ("now", sys.modules["sipit.invert.eps"])) * 2:
        t = time.perf_counter()
        noise = module.measure_noise(tap)
        runs.setdefault(name, []).append((time.perf_counter() - t, max(noise)))
    for name, r in runs.items():
        print(f"  measure_noise {name:6s}: {r[0][0]:.1f} / {r[1][0]:.1f} s, largest noise {r[0][1]:.3g}, "
              f"eps {50 * r[0][1]:.3g}", flush=True)
