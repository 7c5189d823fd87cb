"""The slow prompts of a seed with a fast calibration (any model): each bench prompt (5 a source, 20 tokens) inverted
alone, and for those over 0.5 s the positions that tried more than 64 candidates and the token there.

    python fast_tail.py MODEL LAYER SEED        e.g. gemma3-270m 9 863"""
import sys, time, torch
torch.set_num_threads(2)
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
model, layer, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lm = load_model(model)
tap = LayerTap(lm, layer)
data = prompts(lm, ["prose", "code", "random", "chat"], 5, 20, seed)
ids = torch.tensor([p for _, p in data]); states = tap.states(ids)
engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("fast")), eps=tolerance_for(tap, {states.dtype}).eps)
for i, (src, p) in enumerate(data):
    t = time.perf_counter()
    r = engine.invert_prompt(states[i], p)
    dt = time.perf_counter() - t
    if dt > 0.5 or not r.exact:
        deep = [(t_, q.tried, q.via) for t_, q in enumerate(r.positions) if q.tried > 64]
        print(f"{src} prompt {i}: {dt:.1f} s, exact {r.exact}, {r.status}, deep positions {deep}; "
              f"{lm.decode(p[:max(1, deep[0][0]) if deep else 1])!r} -> {lm.decode([p[deep[0][0]]]) if deep else ''!r}", flush=True)
