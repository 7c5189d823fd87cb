"""The certificates of certify.py at an earlier commit against the current one, on the same inverted prompts (20
seed-5 bench prompts, layers 1 and 15, full calibration): every field equal, and the milliseconds of certifying one
prompt (medians of 50), all positions and position 0 alone (its bounds over the vocabulary).

    python certify_ab.py BEFORE_COMMIT        e.g. 6aa7c5d"""
import copy
import statistics
import subprocess
import sys
import time
import types

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

before = sys.argv[1]
torch.set_num_threads(2)
source = subprocess.check_output(["git", "show", f"{before}:src/sipit/invert/certify.py"], text=True)
old = types.ModuleType("sipit.invert.certify_before")
old.__package__ = "sipit.invert"
exec(compile(source, f"certify.py@{before}", "exec"), old.__dict__)
lm = load_model("smollm2")
fields = lambda ps: [(q.margin, q.margin_over, q.certified, q.certified_by, q.duplicates, q.also_within_eps) for q in ps]
for layer in (1, 15):
    tap = LayerTap(lm, layer)
    ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 5, 20, 5)])
    states = tap.states(ids)
    eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
                eps=tolerance_for(tap, {states.dtype}).eps)
    certifiers = {before: old.Certifier(eng.tap, eng.eps, "none", 256), "now": eng.certifier}
    times = {(name, part): [] for name in certifiers for part in ("all", "position 0")}
    for s, p in zip(states, ids):
        r = eng.invert_prompt(s)
        policy = eng.policy.begin_many([s], [dict(forward_tokens=0, backward_tokens=0, tap_calls=0)])[0]
        out = {}
        for name, certifier in certifiers.items():
            for part, positions in (("all", r.positions), ("position 0", r.positions[:1])):
                for _ in range(50 if s is states[0] else 1):
                    ps = copy.deepcopy(positions)
                    t = time.perf_counter()
                    certifier.certify(s, torch.tensor(r.ids), ps, {}, dict(forward_tokens=0, tap_calls=0), policy)
                    times[name, part].append(time.perf_counter() - t)
                out[name, part] = fields(ps)
        assert out[before, "all"] == out["now", "all"], (layer, r.ids)
    print(f"layer {layer}: {len(ids)} prompts, identical certificates; one prompt's certify, ms: " + ", ".join(
        f"{name} {part} {statistics.median(x) * 1e3:.3f}" for (name, part), x in times.items()))
