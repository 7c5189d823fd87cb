"""What certificates cost: the bench prompts of a seed (PER_SOURCE of each source, 20 tokens) inverted with
certify=MODE, one at a time and in one lock-step batch, against certify none; every inversion exact and `ok`.
Prints seconds a prompt (median), tap calls and tokens a prompt, and the batch's seconds.

    python certify_cost.py LAYER SEED MODE [PER_SOURCE]      e.g. 15 239 top:256 2"""
import statistics
import sys
import time

import torch

from common import bench_prompts, smollm2
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

layer, seed, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
per = int(sys.argv[4]) if len(sys.argv) > 4 else 2
lm = smollm2()
tap = LayerTap(lm, layer)
_, ids, states = bench_prompts(lm, tap, seed, per)
eps = tolerance_for(tap, {torch.float32}).eps
for certify in ("none", mode):
    engine = SipIt(lm, layer, InvertConfig(certify=certify, learned=calibration_config("full")), eps=eps)
    engine.invert_prompt(states[0])  # warm-up
    alone = [engine.invert_prompt(s, p.tolist()) for s, p in zip(states, ids)]
    t = time.perf_counter()
    together = engine.invert_prompts(states, [p.tolist() for p in ids])
    batch = time.perf_counter() - t
    assert all(r.exact and r.status == "ok" for r in alone + together)
    print(f"layer {layer} seed {seed} certify {certify}: {statistics.median(r.seconds for r in alone):.3f} s a prompt "
          f"(median of {len(alone)}), {statistics.mean(r.tap_calls for r in alone):.1f} tap calls, "
          f"{statistics.mean(r.forward_tokens for r in alone):.0f} tokens; one batch of {len(together)}: {batch:.2f} s; "
          f"certified positions {sum(q.certified for r in alone for q in r.positions)}", flush=True)
