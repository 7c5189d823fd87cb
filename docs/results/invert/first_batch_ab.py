"""A search's first batch (InvertConfig.first_batch) in a lock-step batch: the first B bench prompts of a seed (sources
interleaved, as the bench batches them) inverted together by one engine a value, alternating, each run after a batched
forward of the same prompts; seconds, ratio, tokens verified and tap calls, every inversion exact.

    python first_batch_ab.py LAYER SEED B VALUES REPEATS        e.g. 30 1013 32 16,4 2"""
import statistics
import sys
import time

import torch

from common import SOURCES, smollm2
from sipit.bench.invert import interleaved, prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

layer, seed, B = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
values, repeats = [int(v) for v in sys.argv[4].split(",")], int(sys.argv[5])
lm = smollm2()
tap = LayerTap(lm, layer)
data = prompts(lm, SOURCES, 10, 20, seed)
ids = torch.tensor([data[i][1] for i in interleaved(data)[:B]])
states = tap.states(ids)
eps = tolerance_for(tap, {states.dtype}).eps
engines = {v: SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full"), first_batch=v), eps=eps)
           for v in values}
for engine in engines.values():
    engine.invert_prompts(list(states[:4]))  # warm-up
ratios = {v: [] for v in values}
for rep in range(repeats):
    for v, engine in engines.items():
        t = time.perf_counter()
        tap.states(ids)
        forward = time.perf_counter() - t
        t = time.perf_counter()
        results = engine.invert_prompts(list(states))
        seconds = time.perf_counter() - t
        assert all(r.ids == p.tolist() and r.status == "ok" for r, p in zip(results, ids))
        ratios[v].append(seconds / forward)
        print(f"rep {rep} first_batch {v}: {seconds:.2f} s, forward {forward:.3f} s, ratio {seconds / forward:.2f}, "
              f"tokens {sum(r.forward_tokens for r in results)}, tap calls {sum(r.tap_calls for r in results)}", flush=True)
for v in values:
    print(f"first_batch {v}: median ratio {statistics.median(ratios[v]):.2f}")
