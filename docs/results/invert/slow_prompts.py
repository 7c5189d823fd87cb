"""The prompts of a bench set that take over 2 s alone at a layer, and their positions that tried more than 50
candidates (which token, how many, found how).

    python slow_prompts.py LAYER SEED KINDS        e.g. 30 293 prose,code,random"""
import sys, time
from common import bench_prompts, smollm2
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap
layer, seed, kinds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
lm = smollm2(); tap = LayerTap(lm, layer)
data, ids, states = bench_prompts(lm, tap, seed)
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {tap.lm.dtype}).eps)
for i, (k, p) in enumerate(data):
    if k not in kinds: continue
    t = time.perf_counter(); r = eng.invert_prompt(states[i], p); dt = time.perf_counter() - t
    if dt > 2:
        print(f"{k} #{i} {dt:.1f}s exact={r.ids == p} tap_calls={r.tap_calls}")
        print("  text:", repr(lm.decode(p)))
        for t_, q in enumerate(r.positions):
            if q.tried > 50: print(f"   pos {t_} tok {q.token} {lm.decode([q.token])!r} tried {q.tried} via {q.via}")
