"""Where the inversion's time goes, every part timed inside the loop (wrapped calls), as multiples of the forward pass it
is compared with: the bench prompts of a seed (10 a source, 20 tokens), each alone (B = 1: each part's median over
prompts of part ÷ the prompt's own forward) or in lock-step batches of B in the bench's order (the batch's parts ÷ its
batched forward, median over batches). Parts: the loop's passes (tap.extend_many), the ranker's first look at a prompt
(position 0 and the guesses: Learned.begin_many), the deferred re-rankings after a miss and a search's first ranking
(settle_many), the search's later rankings (taken from the policy's queue), the certificates' bookkeeping, the result,
and the rest (the loop itself: distances, positions, generators). Every inversion must be exact and `ok`.

    python time_split.py LAYER B SEED        e.g. 1 1 769; 15 32 773"""
import statistics
import sys
import time
from collections import defaultdict

import torch

import common

from sipit.bench.invert import _forward_seconds, interleaved
from sipit.invert import InvertConfig, SipIt
from sipit.invert.certify import Certifier, Queue
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.policy import Learned
from sipit.models import LayerTap

layer, B, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
lm = common.smollm2()
tap = LayerTap(lm, layer)
data, ids, states = common.bench_prompts(lm, tap, seed)
engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
               eps=tolerance_for(tap, {states[0].dtype}).eps)
spent = defaultdict(float)


def timed(owner, name: str, part: str) -> None:
    """owner.name, timed into spent[part] (not counted twice when it calls itself or another timed part)."""
    f = getattr(owner, name)
    static = isinstance(owner.__dict__.get(name), staticmethod) if isinstance(owner, type) else False

    def g(*a, **k):
        if timed.inside:
            return f(*a, **k)
        timed.inside = True
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[part] += time.perf_counter() - t
            timed.inside = False
    setattr(owner, name, staticmethod(g) if static else g)


timed.inside = False
timed(engine.tap, "extend_many", "passes")
timed(Learned, "begin_many", "first look")
timed(Learned, "settle_many", "re-rankings")
timed(Queue, "take", "search rankings")
for name in ("wanted", "record", "fill"):
    timed(Certifier, name, "certificates")
timed(engine, "_finish", "result")
PARTS = ["passes", "first look", "re-rankings", "search rankings", "certificates", "result", "rest"]

order = interleaved(data)
groups = [order[i:i + B] for i in range(0, len(order) - B + 1, B)]  # (whole batches only)
engine.invert_prompts([states[i] for i in order[:B]])  # warm-up
rows = []  # per group: {part: seconds ÷ its forward}
for g in groups:
    fwd = _forward_seconds(tap, ids[g])
    spent.clear()
    t = time.perf_counter()
    rs = engine.invert_prompts([states[i] for i in g], [ids[i].tolist() for i in g])
    total = time.perf_counter() - t
    assert all(r.exact and r.status == "ok" for r in rs)
    spent["rest"] = total - sum(spent.values())
    rows.append({"total": total / fwd, "passes a prompt": max(r.tap_calls for r in rs),
                 **{p: spent[p] / fwd for p in PARTS}})
print(f"SmolLM2 layer {layer}, {len(order)} bench prompts of seed {seed} (20 tokens), B = {B}: "
      f"{len(groups)} {'prompts' if B == 1 else 'batches'}, every one exact and ok; ÷ the forward, median (mean):")
for key in ["total", "passes a prompt"] + PARTS:
    v = [r[key] for r in rows]
    print(f"  {key:16s} {statistics.median(v):7.3f} ({statistics.mean(v):.3f})")
