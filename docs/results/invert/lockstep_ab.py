"""A/B of two ways a lock-step round is served, the same prompts alternating in one process:
  flat:   passes flat or padded by estimated cost (defb769) vs padded only (tap.pack with flat=False);
  settle: the policies' deferred work settled for the batch at once (eaf5d1a, 16230c8) vs each prompt's
          alone (SipIt._settle never yields: guesses()/candidates() do it per prompt).
Prints, per run, tokens, tap calls, the batch's seconds (of it in passes) and the same ÷ one batched
forward timed right before (that forward itself varies 0.6–1.1 s run to run on a shared 2-core machine,
so the seconds compare better); then the medians. python lockstep_ab.py flat|settle LAYER B SEED REPEATS"""
import importlib
import statistics
import sys
import time

import torch

import sipit.models.tap as T
from sipit.bench.invert import prompts, interleaved, _forward_seconds
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

S = importlib.import_module("sipit.invert.sipit")
what, layer, B, seed, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(2)
lm = load_model("smollm2", max_layer=layer)
data = prompts(lm, ["prose", "code", "random", "chat"], B // 4, 20, seed)
order = interleaved(data)
ids = torch.tensor([p for _, p in data])[order]
tap = LayerTap(lm, layer)
states = tap.states(ids)
tol = tolerance_for(tap, {states.dtype})
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tol.eps)
eng.invert_prompts([states[i] for i in range(4)])  # warm up


def padded_only(shapes, max_tokens, attention, flat=True):
    return pack(shapes, max_tokens, attention, flat=False)


def never(run):
    return
    yield


pack, settle = T.pack, S.SipIt._settle
modes = {"flat": ("flat", "padded"), "settle": ("settled", "alone")}[what]
out = {m: [] for m in modes}
for rep in range(reps):
    for mode in modes if rep % 2 == 0 else modes[::-1]:
        T.pack = pack if mode != "padded" else padded_only
        S.SipIt._settle = staticmethod(settle if mode != "alone" else never)
        fwd = _forward_seconds(tap, ids)
        t = time.perf_counter()
        rs = eng.invert_prompts(list(states), [i.tolist() for i in ids])
        total = time.perf_counter() - t
        assert all(r.exact and r.status == "ok" for r in rs), mode
        passes = sum(r.pass_seconds for r in rs)
        out[mode].append((total / fwd, passes / fwd, (total - passes) / fwd, total, passes))
        print(mode, sum(r.forward_tokens for r in rs), "tokens", sum(r.tap_calls for r in rs), "tap calls",
              f"{total:.3f} s (passes {passes:.3f} s), ratio {total / fwd:.2f} (passes {passes / fwd:.2f}, rest "
              f"{(total - passes) / fwd:.2f}), forward {fwd:.3f} s",
              flush=True)
for m, v in out.items():
    print(m, "medians: seconds", round(statistics.median(x[3] for x in v), 3), "in passes",
          round(statistics.median(x[4] for x in v), 3), "| ratio", round(statistics.median(x[0] for x in v), 2), "passes",
          round(statistics.median(x[1] for x in v), 2), "rest", round(statistics.median(x[2] for x in v), 2))
