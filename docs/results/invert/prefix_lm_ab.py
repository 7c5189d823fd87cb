"""A/B of where a search's LM ranking comes from (Learned._prefix_lm): the blocks above the tap on the observed states
of the prefix (now) against the prefix's ids through the whole model (before), alternating in one process: one
prompt at a time (ratio to its forward) and the bench's first B interleaved prompts in lock-step (ratio to their
batched forward); the same tokens either way (the two give the same log-probs), every inversion exact.

    python prefix_lm_ab.py LAYER SEED [LENGTH] [PROMPTS_PER_SOURCE] [REPEATS] [B]"""
import math
import statistics
import sys
import time

import torch

from sipit.bench.invert import interleaved, prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.policy import Learned
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
layer, seed = int(sys.argv[1]), int(sys.argv[2])
length, per, repeats, B = (int(x) for x in (sys.argv[3:] + ["20", "10", "3", "32"][len(sys.argv) - 3:])[:4])


def from_ids(self, ids):
    """Learned._prefix_lm before: the prefix's ids through the whole model."""
    logp = self.tap.lm.next_token_logprobs(ids)
    if logp is None:
        return None
    self.cost["forward_tokens"] += len(ids)
    self.cost["tap_calls"] += 1
    if len(ids) > 1 and float(logp[:-1].gather(1, ids[1:, None].to(logp.device)).mean()) <= -math.log(self.V):
        return None
    return logp[-1].to(self.target.device)


variants = {"ids (before)": from_ids, "states (now)": Learned._prefix_lm}
lm = load_model("smollm2")
tap = LayerTap(lm, layer)
data = prompts(lm, ["prose", "code", "random", "chat"], per, length, seed)
ids = torch.tensor([p for _, p in data])
states = tap.states(ids)
order = interleaved(data)[:B]
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
eng.invert_prompts(list(states[:2]))
one = {v: [] for v in variants}
lock = {v: [] for v in variants}
for rep in range(repeats):
    for name, f in (list(variants.items()) if rep % 2 else list(variants.items())[::-1]):
        Learned._prefix_lm = f
        for i in range(len(ids)):
            t = time.perf_counter(); tap.states(ids[i]); fw = time.perf_counter() - t
            r = eng.invert_prompt(states[i], ids[i].tolist())
            assert r.ids == ids[i].tolist() and r.status == "ok"
            one[name].append(r.seconds / fw)
        t = time.perf_counter(); tap.states(ids[order]); F = time.perf_counter() - t
        t = time.perf_counter(); res = eng.invert_prompts(list(states[order])); lock[name].append((time.perf_counter() - t) / F)
        assert all(r.ids == ids[j].tolist() for r, j in zip(res, order))
for name in variants:
    print(f"layer {layer}, seed {seed}, {length} tokens, {name}: one at a time median {statistics.median(one[name]):.3f} "
          f"mean {statistics.mean(one[name]):.3f} ({len(ids)} prompts x {repeats}); B = {len(order)} median "
          f"{statistics.median(lock[name]):.3f} {[round(x, 2) for x in lock[name]]}")
