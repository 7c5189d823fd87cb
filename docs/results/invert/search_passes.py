"""Every prompt of a bench set at a layer, alone, slowest last: its ratio to the forward, passes, how its positions
were found (speculation / lookahead / search), the candidates tried at each searched position, the tokens of each pass.

    python search_passes.py LAYER SEED        e.g. 30 389"""
import collections
import statistics
import sys
import time

from common import bench_prompts, smollm2

from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

layer, seed = int(sys.argv[1]), int(sys.argv[2])
lm = smollm2()
tap = LayerTap(lm, layer)
data, ids, states = bench_prompts(lm, tap, seed)
engine = SipIt(lm, layer, InvertConfig(learned=calibration_config("full")), eps=tolerance_for(tap, {states[0].dtype}).eps)
passes = [[]]  # tokens of each pass, per prompt
extend = engine._extend_many


def counted(run, requests):
    passes[-1].append(sum(r.numel() for _, r in requests))
    return (yield from extend(run, requests))


engine._extend_many = counted
engine.invert_prompt(states[0])  # warm-up
rows = []
for (kind, _), target, truth in zip(data, states, ids):
    passes.append([])
    t = time.perf_counter()
    r = engine.invert_prompt(target, truth.tolist())
    rows.append((time.perf_counter() - t, kind, r, passes[-1]))
forward = statistics.median(min((lambda t: (tap.states(i), time.perf_counter() - t)[1])(time.perf_counter())
                                for _ in range(3)) for i in ids[:10])
for seconds, kind, r, tokens in sorted(rows, key=lambda x: x[0]):
    via = dict(collections.Counter(q.via for q in r.positions))
    searched = [q.tried for q in r.positions if q.via in ("search", "lookahead") and q.tried > 1]
    print(f"{seconds / forward:6.1f}x {kind:6s} exact {r.exact} passes {r.tap_calls:3d} via {via} tried {searched} "
          f"tokens/pass {tokens}")
print(f"forward {forward * 1e3:.1f} ms; median ratio {statistics.median(x[0] for x in rows) / forward:.2f}")
