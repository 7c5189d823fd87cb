"""A calibration's lens fitted on N rows, for each N: the fit's seconds, the wrong first guesses (positions 1-19 of
the bench prompts, by source), prompts inverted in one pass, passes and exact inversions, per seed. Each N is its own
calibration (lens_rows is part of the key): run on an empty SIPIT_CACHE but the dequantized weights to time fits.
    python lens_rows_ab.py LAYER ROWS SEEDS [MODEL] [MODE]      e.g. 15 256,64,128,0 941,947,953 smollm2 fast"""
import sys
import time
from dataclasses import replace

import torch
from common import bench_prompts

from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import LearnedConfig
from sipit.models import LayerTap, load_model

layer, rows = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
seeds = [int(s) for s in sys.argv[3].split(",")]
model = sys.argv[4] if len(sys.argv) > 4 else "smollm2"
mode = sys.argv[5] if len(sys.argv) > 5 else "fast"
lm = load_model(model)
tap = LayerTap(lm, layer)
tests = {s: bench_prompts(lm, tap, s) for s in seeds}
eps = tolerance_for(tap, {torch.float32}).eps
for n in rows:
    t = time.perf_counter()
    engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=replace(
        LearnedConfig.fast() if mode == "fast" else LearnedConfig(), lens_rows=n)), eps=eps)
    fit, ranker = time.perf_counter() - t, engine.policy.ranker
    for s, (data, ids, states) in tests.items():
        wrong = [int((g != p[1:]).sum()) for (g, _), p in zip(ranker.guesses(states), ids)]
        by_source = {}
        for (source, _), w in zip(data, wrong):
            by_source[source] = by_source.get(source, 0) + w
        results = [engine.invert_prompt(st) for st in states]
        exact = sum(r.ids == p.tolist() for r, p in zip(results, ids))
        calls = [r.tap_calls for r in results]
        print(f"{lm.name} {mode} L{layer} lens_rows {n} fit {fit:.1f} s (lens {ranker.cal.lens_w is not None}) seed {s}: "
              f"wrong {sum(wrong)} of {sum(len(p) - 1 for p in ids)} {by_source}, one pass {sum(c == 1 for c in calls)}/"
              f"{len(calls)}, passes {sum(calls)}, exact {exact}/{len(calls)}", flush=True)
