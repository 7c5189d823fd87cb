"""How many guessed tokens a speculation or lookahead row should carry (InvertConfig.speculate_tokens): a wrong
guess at t wastes the tokens computed after it, and each one costs the pass that re-verifies the rest (a row
wholly right doubles the next: SipIt._guess). The bench prompts of a seed at a length, inverted with each cap
in turn (alternating, one process), every inversion exact; per cap the median ratio to the forward, tokens
pushed and passes a prompt.
    python speculate_tokens.py LAYER SEED LENGTH CAPS [PER_SOURCE] [REPEATS] [B]    e.g. 15 5 200 0,32 2 2
(cap 0: none, every guess carried; a cap ending in n, e.g. 32n: every prompt's first row capped, whatever the
engine's history says: SipIt._reliable). With B > 1 the prompts go in lock-step batches of B (bench order, the
sources interleaved) and the ratio is to the batch's batched forward. Another model: MODEL=gemma3-270m CAL=fast
(default smollm2, full calibration)."""
import os
import statistics
import sys
import time

import torch

from common import SOURCES
from sipit.bench.invert import _forward_seconds, interleaved, prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

layer, seed, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
caps = sys.argv[4].split(",")
per_source = int(sys.argv[5]) if len(sys.argv) > 5 else 2
repeats = int(sys.argv[6]) if len(sys.argv) > 6 else 2
B = int(sys.argv[7]) if len(sys.argv) > 7 else 1
lm = load_model(os.environ.get("MODEL", "smollm2"))
tap = LayerTap(lm, layer)
data = prompts(lm, SOURCES, per_source, length, seed)
ids = torch.tensor([p for _, p in data])
states = tap.states(ids)
engine = SipIt(lm, layer, InvertConfig(learned=calibration_config(os.environ.get("CAL", "full"))), eps=tolerance_for(tap, {states.dtype}).eps)
engine.invert_prompt(states[0])  # warm-up
reliable = engine._reliable
ratios = {c: [] for c in caps}
tokens = {c: [] for c in caps}
calls = {c: [] for c in caps}
order = interleaved(data)
groups = [order[i:i + B] for i in range(0, len(order), B)]
for _ in range(repeats):
    for g in groups:
        fwd = _forward_seconds(tap, ids[g])
        for c in caps:
            engine.config.speculate_tokens = int(c.rstrip("n")) or 10**9
            engine._reliable = (lambda T: False) if c.endswith("n") else reliable
            t = time.perf_counter()
            rs = engine.invert_prompts([states[i] for i in g], [ids[i].tolist() for i in g])
            assert all(r.exact and r.status == "ok" for r in rs), c
            ratios[c].append((time.perf_counter() - t) / fwd)
            tokens[c].append(sum(r.forward_tokens for r in rs) / len(g))
            calls[c].append(max(r.tap_calls for r in rs))
for c in caps:
    print(f"layer {layer} seed {seed} length {length} cap {c}: median ratio {statistics.median(ratios[c]):.2f} "
          f"(mean {statistics.mean(ratios[c]):.2f}), tokens {statistics.mean(tokens[c]):.0f}, "
          f"passes {statistics.mean(calls[c]):.1f} a prompt (in a batch: its most)", flush=True)
