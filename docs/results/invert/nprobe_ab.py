"""The cluster index's probe count at layer 1 (SmolLM2, full calibration): the same prompts inverted one at a
time with each nprobe in turn, alternating, in one process; every inversion exact.

    python nprobe_ab.py NPROBES SEEDS REPEATS        e.g. 4,8,16 1,7,13,17,23 3

The index was removed at 692fd15 (no calibration needs it since the screens score projected distances): run this
at 118cc7e–2fa4310 (`git checkout 2fa4310 -- src`, then back).
Per seed and nprobe: index guesses that differ from exact scoring (of 760), prompts inverted in one pass, and
the median ratio (seconds ÷ a forward of the prompt timed in the same run)."""
import statistics
import sys
import time

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

nprobes = [int(x) for x in sys.argv[1].split(",")]
seeds, repeats = [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
torch.set_num_threads(2)
lm = load_model("smollm2")
tap = LayerTap(lm, 1)
eng = None
for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    ids = torch.tensor([p for _, p in data])
    states = tap.states(ids)
    if eng is None:
        eng = SipIt(lm, 1, InvertConfig(policy="learned", learned=calibration_config("full")),
                    eps=tolerance_for(tap, {states.dtype}).eps)
        ranker = eng.policy.ranker
        print("built with nprobe", ranker.index.nprobe, "of", len(ranker.index.centroids), "clusters")
        for i in range(4):
            eng.invert_prompt(states[i])
    res = ranker.context_residuals(*[s.float() for s in states])
    exact = (2 * res @ ranker.cal.P.T - ranker.gain * ranker.cal.P_sq).argmax(1)
    ratios = {n: [] for n in nprobes}
    one_pass = {n: 0 for n in nprobes}
    for rep in range(repeats):
        for i in range(len(ids)):
            t = time.perf_counter()
            tap.states(ids[i])
            forward = time.perf_counter() - t
            for n in (nprobes if (rep + i) % 2 == 0 else nprobes[::-1]):
                ranker.index.nprobe = n
                t = time.perf_counter()
                r = eng.invert_prompt(states[i], ids[i].tolist())
                ratios[n].append((time.perf_counter() - t) / forward)
                assert r.exact and r.status == "ok", (seed, i, n)
                one_pass[n] += rep == 0 and r.tap_calls == 1
    for n in nprobes:
        ranker.index.nprobe = n
        differ = int((ranker.index.top1(res, ranker.gain) != exact).sum())
        print(f"seed {seed} nprobe {n}: index differs from exact on {differ} of {len(exact)}, one-pass "
              f"{one_pass[n]}/40, median ratio {statistics.median(ratios[n]):.2f}", flush=True)
