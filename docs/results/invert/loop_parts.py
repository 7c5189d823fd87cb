"""Where a one-pass prompt's time goes, each part timed inside the loop (wrapped calls, medians over 3 repeats):
position 0, the guesses, the pass, the certificates, against a forward of the same prompt.

    python loop_parts.py LAYER        e.g. 1 (the seed-5 bench prompts that need one pass)"""
import time, statistics, torch, sys
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer = int(sys.argv[1])
lm = load_model("smollm2")
tap = LayerTap(lm, layer)
ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 10, 20, 5)])
states = tap.states(ids)
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
timers = {}
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); out = f(*a, **k); timers.setdefault(key, []).append(time.perf_counter() - t); return out
    setattr(obj, name, g)
wrap(eng.certifier, "certify", "certify")
wrap(eng, "_finish", "finish")
wrap(eng.tap, "extend_many", "pass")
wrap(eng.tap, "prefill", "prefill")
wrap(eng.policy, "begin_many", "begin_many")
wrap(eng.policy.ranker, "position0", "position0")
wrap(eng.policy.ranker, "guesses", "guesses")
one = [i for i in range(40) if eng.invert_prompt(states[i]).tap_calls == 1]
timers.clear(); tot = []
for rep in range(3):
    for i in one:
        t = time.perf_counter(); eng.invert_prompt(states[i], ids[i].tolist()); tot.append(time.perf_counter() - t)
f = []
for i in one:
    t = time.perf_counter(); tap.states(ids[i]); f.append(time.perf_counter() - t)
print(f"layer {layer}: {len(one)} one-pass prompts, total median {statistics.median(tot)*1e3:.2f} ms, forward {statistics.median(f)*1e3:.2f} ms")
for k, v in timers.items():
    print(f"  {k:10s} {statistics.median(v)*1e3:.3f} ms x {len(v)/len(tot):.1f}")
