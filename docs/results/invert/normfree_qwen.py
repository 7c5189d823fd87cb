"""normfree_ab.py's variants on Qwen2.5-Coder-1.5B (fast calibration) at a layer, the bench prompts of a seed of the
given sources, alternating per prompt; every prompt's seconds, ratio to its forward, exactness, status and passes.

    python normfree_qwen.py LAYER SEED PER_SOURCE SOURCES VARIANTS      e.g. 28 443 6 random,code base,E"""
import statistics
import sys
import time

import torch
from normfree_ab import apply

from sipit.bench.invert import _forward_seconds, interleaved, prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
layer, seed, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
lm = load_model("qwen2.5-coder-1.5b")
tap = LayerTap(lm, layer)
data = prompts(lm, sys.argv[4].split(","), n, 20, seed)
ids = torch.tensor([p for _, p in data])
states = tap.states(ids)
engine = SipIt(lm, layer, InvertConfig(learned=calibration_config("fast")), eps=tolerance_for(tap, {states.dtype}).eps)
engine.invert_prompt(states[0])  # warm-up
forward = _forward_seconds(tap, ids[0])
ratios = {v: [] for v in sys.argv[5].split(",")}
for i in interleaved(data):
    line = []
    for v in ratios:
        apply(v)
        t = time.perf_counter()
        r = engine.invert_prompt(states[i], ids[i].tolist())
        seconds = time.perf_counter() - t
        ratios[v].append(seconds / forward)
        line.append(f"{v} {seconds:.1f} s ({seconds / forward:.1f}x) exact {r.exact} {r.status} passes {r.tap_calls}")
    print(i, data[i][0], " | ".join(line), flush=True)
for v, x in ratios.items():
    print(f"Qwen2.5-Coder-1.5B layer {layer} fast, seed {seed}, {len(x)} prompts, {v}: median ratio "
          f"{statistics.median(x):.2f}, mean {statistics.mean(x):.2f}, max {max(x):.1f}")
