"""Tried, not kept: KV caches holding only the layers a tap's blocks write (SmolLM2 layer 1: 1 of 30; every cache
helper copies each layer) against all of them, alternating in one process: one prompt at a time (ratio to its
forward) and the bench's first 32 interleaved prompts in lock-step.

    python cache_layers_ab.py LAYER SEED"""
import sys, time, statistics, copy, torch
from sipit.bench.invert import prompts, interleaved
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer, seed = int(sys.argv[1]), int(sys.argv[2])
lm = load_model("smollm2"); tap = LayerTap(lm, layer)
data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
ids = torch.tensor([p for _, p in data]); states = tap.states(ids); order = interleaved(data)[:32]
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
full = type(lm).new_cache
def short(self=lm):
    c = full(lm); c.layers = c.layers[:layer]; return c
V = {"all layers": lambda: full(lm), "tap's layers": short}
one = {v: [] for v in V}; bat = {v: [] for v in V}
eng.invert_prompts(list(states[:4]))
for rep in range(3):
    for v, f in (list(V.items()) if rep % 2 else list(V.items())[::-1]):
        lm.new_cache = f
        for i in range(len(ids)):
            t = time.perf_counter(); tap.states(ids[i]); fw = time.perf_counter() - t
            r = eng.invert_prompt(states[i], ids[i].tolist()); one[v].append(r.seconds / fw)
            assert r.ids == ids[i].tolist()
        t = time.perf_counter(); tap.states(ids[order]); F = time.perf_counter() - t
        t = time.perf_counter(); res = eng.invert_prompts(list(states[order])); bat[v].append((time.perf_counter() - t) / F)
        assert all(r.ids == ids[j].tolist() for r, j in zip(res, order))
for v in V:
    print(f"layer {layer} seed {seed} {v:12s}: one median {statistics.median(one[v]):.3f}  B=32 {statistics.median(bat[v]):.3f} {[round(x, 2) for x in bat[v]]}")
