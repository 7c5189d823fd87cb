"""Lock-step batches of 32 (8 prompts of each source, one batch a seed) with the search batches capped at each size
(InvertConfig.batch_size: the schedule 16, 64, 256 becomes 16, 64, 64, ... or 16, 32, 32, ...), alternating in
one process (common.alternate), every inversion exact.

    python lockstep_batch_size.py LAYER SEEDS SIZES [B]        e.g. 15 479,487,491,499 256,64,32"""
import sys
from dataclasses import replace
from common import alternate
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
sizes = [int(s) for s in sys.argv[3].split(",")]
B = int(sys.argv[4]) if len(sys.argv) > 4 else 32
def setting(n):
    return lambda e: setattr(e, "config", replace(e.config, batch_size=n))
for seed in seeds:
    alternate(layer, seed, 20, {f"batch_size {n}": setting(n) for n in sizes}, per_source=8, repeats=3, B=B)
