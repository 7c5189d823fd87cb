"""A file's prompts in lock-step, chunked against a sliding window: N bench prompts of a seed (sources interleaved, as
the bench takes them) inverted by one learned engine either in consecutive chunks of B (each chunk waits for its slowest
prompt: the driver before the window) or with at most B in flight, the next starting as one finishes
(SipIt.invert_prompts(window=B): the driver now), alternating in one process. Per way: total seconds, the ratio to
batched forwards of the same prompts in chunks of B, and the shared passes (rounds); every inversion exact and `ok`.

    python lockstep_window_ab.py LAYER SEED PROMPTS_PER_SOURCE B REPEATS        e.g. 15 661 24 32 2"""
import statistics
import sys
import time

import torch

from common import SOURCES, smollm2
from sipit.bench.invert import _forward_seconds, interleaved, prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

layer, seed, per_source, B, repeats = (int(a) for a in sys.argv[1:6])
lm = smollm2()
tap = LayerTap(lm, layer)
data = prompts(lm, SOURCES, per_source, 20, seed)
order = interleaved(data)
ids = torch.tensor([data[i][1] for i in order])
states = list(tap.states(ids))
engine = SipIt(lm, layer, InvertConfig(learned=calibration_config("full")), eps=tolerance_for(tap, {states[0].dtype}).eps)
engine.invert_prompt(states[0])  # warm-up
chunks = range(0, len(states), B)
rounds = []  # one entry per shared pass (tap.extend_many call)
many = engine.tap.extend_many
engine.tap.extend_many = lambda *a: rounds.append(1) or many(*a)


def chunked():
    return [r for s in chunks for r in engine.invert_prompts(states[s:s + B], ids[s:s + B].tolist())]


def windowed():
    return engine.invert_prompts(states, ids.tolist(), window=B)


seconds = {"chunked": [], "window": []}
passes = {}
forward = []
for k in range(repeats):
    forward.append(sum(_forward_seconds(tap, ids[s:s + B]) for s in chunks))
    for name, f in (("chunked", chunked), ("window", windowed))[::1 if k % 2 == 0 else -1]:
        rounds.clear()
        t = time.perf_counter()
        results = f()
        seconds[name].append(time.perf_counter() - t)
        passes[name] = len(rounds)
        assert all(r.exact and r.status == "ok" for r in results), name
fwd = statistics.median(forward)
print(f"smollm2 layer {layer} seed {seed}, {len(states)} prompts, B {B}: batched forwards {fwd:.2f} s; " + "; ".join(
    f"{name} {statistics.median(v):.2f} s ({', '.join(f'{x:.2f}' for x in v)}), ratio {statistics.median(v) / fwd:.2f}, "
    f"{passes[name]} rounds"
    for name, v in seconds.items()), flush=True)
