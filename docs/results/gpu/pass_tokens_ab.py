"""Shared passes of 1,024 new tokens (the CPU's default, every device's before) against 4,096 (a GPU's default
now, InvertConfig.pass_tokens), the same prompts, one setting after the other in one process: (a) one 20-token random-id prompt
certified in full (the whole vocabulary evaluated at every position, in the loop's shared passes); (b) 8 prompts
in lock-step, no certificates. Every result must be the same with both.

    PYTHONPATH=src python docs/results/gpu/pass_tokens_ab.py OUT.json [MODEL] [LAYER] [REPEATS]

Defaults: random:llama-3.1-8b (bf16 on a GPU, fp32 on a CPU), layer 1, 1 repeat (each run on a fresh engine: the
same history). Writes the JSON as each part ends.
"""
import json
import statistics
import sys
import time

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.models import LayerTap, load_model
from sipit.models.device import sync

out = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else "random:llama-3.1-8b"
layer = int(sys.argv[3]) if len(sys.argv) > 3 else 1
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 1
cuda = torch.cuda.is_available()
lm = load_model(model, precision="bf16" if cuda else "fp32", device="cuda" if cuda else "cpu",
                max_layer=None if model.startswith("tiny") else layer)
tap = LayerTap(lm, layer)
ids = torch.tensor([p for _, p in prompts(lm, ["random"], 9, 20, 1)])
states = tap.states(ids)
eps = tolerance_for(tap, {states.dtype}).eps
sizes = (1024, 4096)
SipIt(lm, layer, InvertConfig(policy="learned"), eps=eps, tap=tap).invert_prompts([states[0]])  # warm-up, calibration
report = dict(device=torch.cuda.get_device_name() if cuda else "cpu", model=lm.name, layer=layer, eps=eps, parts={})


def save():
    with open(out, "w") as f:
        json.dump(report, f, indent=1)


def timed(eng, targets):
    sync(lm.device)
    t = time.perf_counter()
    res = eng.invert_prompts(targets)
    sync(lm.device)
    return time.perf_counter() - t, res


for part, certify, rows in (("certify_full", "full", slice(0, 1)), ("lock_step_8", "none", slice(1, 9))):
    targets, truth = list(states[rows]), ids[rows].tolist()
    runs = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            eng = SipIt(lm, layer, InvertConfig(policy="learned", certify=certify, pass_tokens=n), eps=eps, tap=tap)
            seconds, res = timed(eng, targets)
            runs[n].append(dict(seconds=round(seconds, 2), tap_calls=sum(r.tap_calls for r in res),
                                exact=sum(r.ids == p for r, p in zip(res, truth)),
                                statuses=[r.status for r in res],
                                certified=sum(q.certified for r in res for q in r.positions)))
            print(part, n, runs[n][-1], flush=True)
    outcome = [{k: r[k] for k in ("exact", "statuses", "certified")} for n in sizes for r in runs[n]]
    same = all(o == outcome[0] for o in outcome)
    report["parts"][part] = dict(runs={str(n): v for n, v in runs.items()}, same_results=same,
                                 median_seconds={str(n): statistics.median(r["seconds"] for r in runs[n]) for n in sizes})
    print(part, "median seconds", report["parts"][part]["median_seconds"], "same results", same, flush=True)
    save()
