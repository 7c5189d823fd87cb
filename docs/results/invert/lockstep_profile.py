"""Where a lock-step batch's time goes: B bench prompts (seed 5, sources interleaved as the bench takes them) inverted
together once to warm up, then timed against their batched forward, then under torch.profiler: the ops by self CPU
time, grouped by input shapes (a product's shapes tell a pass's from a screen's).

    python lockstep_profile.py LAYER B [ROWS]        e.g. 1 32 (ROWS: how many ops to list, default 25)"""
import sys
import time

import torch
from torch.profiler import profile

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
layer, B = int(sys.argv[1]), int(sys.argv[2])
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 25
lm = load_model("smollm2")
tap = LayerTap(lm, layer)
ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 10, 20, 5)])[:B]
states = tap.states(ids)
engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
               eps=tolerance_for(tap, {states.dtype}).eps)
engine.invert_prompts(list(states))
t = time.perf_counter()
engine.invert_prompts(list(states))
batch = time.perf_counter() - t
t = time.perf_counter()
tap.states(ids)
print(f"layer {layer}, B = {B}: the batch {batch * 1e3:.1f} ms, its batched forward {(time.perf_counter() - t) * 1e3:.1f} ms")
with profile(record_shapes=True) as p:
    engine.invert_prompts(list(states))
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=rows))
