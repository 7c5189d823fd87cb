"""Tried, not kept: a top-k by block maxima (the k best blocks of 64 columns by their maxima hold the top k) for the
screens and position 0 (5e97427's ranker.top_k), against torch's top-k, alternating in one process: one prompt at a
time (ratio to its forward) and the bench's first 32 interleaved prompts in lock-step (ratio to their batched forward).

    python topk_ab.py LAYER SEED MODEL [CALIBRATION] [PROMPTS_PER_SOURCE]

5e97427's ranker.py is read with `git show` and its top_k swapped: "block" (as 5e97427), "float_only" (block maxima
for float32 scores only: position 0; the bfloat16 screens' torch top-k) and "plain" (torch's top-k everywhere, as
now). Its calibration settings are the current ones."""
import statistics
import subprocess
import sys
import time
import types

import torch

from sipit.bench.invert import interleaved, prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
layer, seed, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cal = sys.argv[4] if len(sys.argv) > 4 else "full"
per = int(sys.argv[5]) if len(sys.argv) > 5 else 10

source = subprocess.check_output(["git", "show", "5e97427:src/sipit/invert/learned/ranker.py"], text=True)
R = types.ModuleType("sipit.invert.learned.ranker_5e97427")
R.__package__ = "sipit.invert.learned"
exec(compile(source, "ranker.py@5e97427", "exec"), R.__dict__)

lm = load_model(model)
tap = LayerTap(lm, layer)
data = prompts(lm, ["prose", "code", "random", "chat"], per, 20, seed)
ids = torch.tensor([p for _, p in data])
states = tap.states(ids)
order = interleaved(data)[:32]
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config(cal)), eps=tolerance_for(tap, {states.dtype}).eps)
now = eng.policy.ranker
eng.policy.ranker = R.LinearRanker(now.cal, tap, now.screen_top, guess_top=now.guess_top)
block = R.top_k
variants = {
    "block": block,
    "float_only": lambda x, k, largest=True: block(x, k, largest) if x.dtype == torch.float32 else x.topk(k, dim=1, largest=largest).indices,
    "plain": lambda x, k, largest=True: x.topk(k, dim=1, largest=largest).indices,
}
one = {v: [] for v in variants}
lock = {v: [] for v in variants}
eng.invert_prompts(list(states[:4]))
for rep in range(3):
    for name, f in (list(variants.items()) if rep % 2 else list(variants.items())[::-1]):
        R.top_k = f
        for i in range(len(ids)):
            t = time.perf_counter(); tap.states(ids[i]); fw = time.perf_counter() - t
            t = time.perf_counter(); r = eng.invert_prompt(states[i], ids[i].tolist()); one[name].append((time.perf_counter() - t) / fw)
            assert r.ids == ids[i].tolist() and r.status == "ok"
        t = time.perf_counter(); tap.states(ids[order]); F = time.perf_counter() - t
        t = time.perf_counter(); res = eng.invert_prompts(list(states[order])); lock[name].append((time.perf_counter() - t) / F)
        assert all(r.ids == ids[j].tolist() for r, j in zip(res, order))
for name in variants:
    print(f"{model} layer {layer} seed {seed} {name:10s}: one at a time median {statistics.median(one[name]):.3f}  "
          f"B = {len(order)} {statistics.median(lock[name]):.3f} {[round(x, 2) for x in lock[name]]}")
