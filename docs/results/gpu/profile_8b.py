"""Where an inversion's time goes outside the forward passes: cProfile of the `learned` policy inverting
random-id prompts of random:llama-3.1-8b (bf16) on a GPU, every CUDA call synchronous
(CUDA_LAUNCH_BLOCKING=1) so that a kernel's time lands on the Python line that launched it.

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=src python docs/results/gpu/profile_8b.py LAYER [PROMPTS]

Calibrates (one-time) and inverts one prompt unprofiled, then PROMPTS (default 1) profiled; prints the
results, the seconds in passes vs the rest, and the 35 functions with the most own time.
"""
import cProfile
import pstats
import sys

import torch

from sipit.invert import InvertConfig, invert
from sipit.models import LayerTap, load_model

layer = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1
lm = load_model("random:llama-3.1-8b", precision="bf16", device="cuda", max_layer=layer)
tap = LayerTap(lm, layer)
ids = torch.randint(0, lm.vocab_size, (1 + n, 20), generator=torch.Generator().manual_seed(1)).to(lm.device)
states = tap.states(ids)
invert(lm, states[:1], layer, InvertConfig(), progress=False, true_ids=ids[:1].tolist(), tap=tap)
prof = cProfile.Profile()
prof.enable()
r = invert(lm, states[1:], layer, InvertConfig(), progress=False, true_ids=ids[1:].tolist(), tap=tap)
prof.disable()
for p in r.prompts:
    print(f"L{layer}: {p.status} exact={p.exact} {p.seconds:.2f} s, passes {p.pass_seconds:.2f} s, "
          f"tap calls {p.tap_calls}, tried/position {sum(q.tried for q in p.positions) / len(p.positions):.0f}")
pstats.Stats(prof).sort_stats("tottime").print_stats(35)
