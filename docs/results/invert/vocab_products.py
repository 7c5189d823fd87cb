"""The ranker's products over the vocabulary at layer 30: which shapes a one-at-a-time inversion runs and their share
of its time (ranker.against wrapped; the bench prompts of a seed, every fourth, full calibration), then each shape
timed through torch's default (x @ tableᵀ: MKL on this project's CPU build) and through oneDNN (mkldnn_linear on
the table converted once), alternating in one process, medians.

    python vocab_products.py SEED        e.g. 1033"""
import statistics
import sys
import time
from collections import defaultdict

import torch

import common

from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

seed = int(sys.argv[1])
ranker_module = sys.modules["sipit.invert.learned.ranker"]
lm = common.smollm2()
tap = LayerTap(lm, 30)
data, ids, states = common.bench_prompts(lm, tap, seed)
engine = SipIt(lm, 30, InvertConfig(policy="learned", learned=calibration_config("full")),
               eps=tolerance_for(tap, {states[0].dtype}).eps)
engine.invert_prompt(states[0], ids[0].tolist())  # warm-up
against, spent = ranker_module.against, defaultdict(lambda: [0, 0.0])


def timed(x, table):
    t = time.perf_counter()
    out = against(x, table)
    key = (len(x) if len(x) < 3 else "3-19" if len(x) < 20 else "20+", table.shape[1])
    spent[key][0] += 1
    spent[key][1] += time.perf_counter() - t
    return out


ranker_module.against = timed
total, forward = 0.0, []
picked = range(0, len(states), 4)
for i in picked:
    t = time.perf_counter()
    assert engine.invert_prompt(states[i], ids[i].tolist()).exact
    total += time.perf_counter() - t
    t = time.perf_counter()
    tap.states(ids[i][None])
    forward.append(time.perf_counter() - t)
ranker_module.against = against
fwd = statistics.median(forward)
products = sum(s for _, s in spent.values())
print(f"SmolLM2 layer 30, {len(picked)} bench prompts of seed {seed}: {total:.2f} s, of it the vocabulary products "
      f"{products:.2f} s ({products / len(picked) / fwd:.2f} forwards a prompt; forward {fwd * 1e3:.0f} ms)")
for (rows, k), (n, s) in sorted(spent.items(), key=lambda kv: -kv[1][1]):
    print(f"  rows {rows} x width {k}: {n} products, {s:.2f} s")


V = lm.vocab_size
print(f"one product of x [rows, width] against a table [{V}, width], ms (median of 3 alternations of 7 calls):")
for rows, k in [(1, 576), (2, 576), (19, 576), (128, 576), (19, 131), (19, 35), (128, 35)]:
    g = torch.Generator().manual_seed(0)
    table, x = torch.randn(V, k, generator=g), torch.randn(rows, k, generator=g)
    packed = table.to_mkldnn()
    ways = {"torch": lambda: x @ table.T,
            "oneDNN": lambda: torch._C._nn.mkldnn_linear(x.to_mkldnn(), packed, None).to_dense()}
    got = {name: [] for name in ways}
    for _ in range(3):
        for name, f in ways.items():
            f()  # (warm)
            got[name].append(common.median_ms(f))
    print(f"  {rows:4d} x {k:3d}: " + ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in got.items()),
          flush=True)
