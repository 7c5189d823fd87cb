"""A 196-token prose prompt (long_prompt.txt, written for this check) at a layer of SmolLM2 (full calibration): its
inversion against a forward of it (medians of 3, twice), the loop's passes (prefix length, rows, layout, ms), then
what a pass costs by prefix length and new tokens (one row, padded; medians of 5) and a plain forward of 32, 64 and
196 tokens.

    python long_prompt.py LAYER        e.g. 15"""
import sys
import time
from pathlib import Path

import torch

from common import median_ms, smollm2
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

layer = int(sys.argv[1])
lm = smollm2()
ids = torch.tensor(lm.encode((Path(__file__).parent / "long_prompt.txt").read_text().strip()))
tap = LayerTap(lm, layer)
states = tap.states(ids)
engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
               eps=tolerance_for(tap, {states.dtype}).eps)
passes = []
extend_many = engine.tap.extend_many


def traced(requests, *args, **kwargs):
    start = time.perf_counter()
    out = extend_many(requests, *args, **kwargs)
    passes.append(([p.length for p, _ in requests], [tuple(r.shape) for _, r in requests], time.perf_counter() - start))
    return out


engine.tap.extend_many = traced
for _ in range(2):
    passes.clear()
    forward = median_ms(lambda: tap.states(ids[None]), 3)
    start = time.perf_counter()
    r = engine.invert_prompt(states, ids.tolist())
    seconds = time.perf_counter() - start
    wrong = [t for t, q in enumerate(r.positions) if q.tried > 1]
    print(f"layer {layer}, T = {len(ids)}: inversion {seconds * 1e3:.0f} ms, forward {forward:.0f} ms, ratio "
          f"{seconds * 1e3 / forward:.2f}, exact {r.exact}, {r.forward_tokens} tokens in {len(passes)} passes, "
          f"positions that tried more than one candidate {wrong}", flush=True)
for prefixes, rows, s in passes:
    print(f"  pass: prefixes {prefixes} rows {rows} {s * 1e3:.0f} ms")
for t in (0, 32, 77, 136, 173):
    prefix = tap.prefill(ids[:t])
    prefix.cache
    cost = [f"k={k} {median_ms(lambda: tap.extend(prefix, ids[t:t + k][None], layout='padded'), 5):.0f}"
            for k in (1, 8, 23, 32, 64) if t + k <= len(ids)]
    print(f"one row of k new tokens after {t:3d}: " + ", ".join(cost) + " ms", flush=True)
for T in (32, 64, len(ids)):
    print(f"a plain forward of {T} tokens: {median_ms(lambda: tap.states(ids[:T][None]), 5):.0f} ms")
