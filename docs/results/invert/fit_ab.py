"""The fit after the pass (fit._calibration: predictions, gains, screening ranks, position 0's screen, the priors) of
the current code against an earlier commit's, on the same inputs, alternating in one process: its seconds per layer
(medians) and whether the two Calibrations are identical, tensor for tensor. The pass runs once (the current code),
its per-layer inputs captured.

    python fit_ab.py MODE LAYERS COMMIT REPEATS [MODEL]        e.g. fast 1,15,30 8c6cf3e 3 (MODEL: smollm2)"""
import statistics
import sys
import time
from dataclasses import fields

import torch

from common import module_before
from sipit.invert.learned import fit
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

mode, layers, commit, repeats = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3], int(sys.argv[4])
before = module_before(commit, "fit")
before.predictions = module_before(commit, "cache").predictions  # (the fit reads the cache module's)
lm = load_model(sys.argv[5] if len(sys.argv) > 5 else "smollm2")


def copied(args):
    return tuple(dict(a) if isinstance(a, dict) else a for a in args)


captured = []  # each layer's arguments; the dicts copied (a full fit deletes its model's A and mx)
current = fit._calibration
fit._calibration = lambda *args: captured.append(copied(args)) or current(*args)
t = time.perf_counter()
list(fit._fitted(lm, [LayerTap(lm, layer) for layer in layers], calibration_config(mode)))
print(f"{mode}, layers {layers}: pass and fit {time.perf_counter() - t:.1f} s, 2 threads", flush=True)


def same(a, b) -> bool:
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name != "seconds" and not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y):
            print(f"  differs: {f.name}")
            return False
    return True


for layer, args in zip(layers, captured):
    seconds, identical = {"before": [], "now": []}, True
    for _ in range(repeats):
        cals = {}
        for name, run in (("before", lambda a: before._calibration(*a[:8])), ("now", lambda a: current(*a))):
            a = copied(args)
            t = time.perf_counter()
            cals[name] = run(a)
            seconds[name].append(time.perf_counter() - t)
        identical &= same(cals["before"], cals["now"])
    print(f"layer {layer}: before {statistics.median(seconds['before']):.2f} s, now "
          f"{statistics.median(seconds['now']):.2f} s (medians of {repeats}), identical: {identical}", flush=True)
