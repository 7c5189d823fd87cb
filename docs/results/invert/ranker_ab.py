"""A/B of the learned ranker at an earlier commit against the current one, in one process on the same
held-out prompts, alternating: one at a time and in lock-step batches of up to 32.

    python ranker_ab.py BEFORE_COMMIT LAYER SEED REPEATS [PROMPTS_PER_SOURCE] [MODEL] [CALIBRATION]

(MODEL: smollm2 by default; CALIBRATION: full or fast, full by default.)

The earlier ranker.py (and index.py, where it had one) are read with `git show` and swapped into one of two otherwise
identical engines, with the earlier commit's calibration and index (read by its config.py, cache.py and index.py: where
its cache VERSION differs, that calibration must be cached already, e.g. by running the earlier commit once);
every inversion must be exact. Prints the median ratio
(seconds ÷ a forward of the prompt timed in the same run) alone, and the lock-step batch's seconds ÷ its
batched forward over REPEATS runs."""
import statistics
import subprocess
import sys
import time

import torch

import common

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

before, layer, seed, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
per_source = int(sys.argv[5]) if len(sys.argv) > 5 else 10
model = sys.argv[6] if len(sys.argv) > 6 else "smollm2"
calibration = sys.argv[7] if len(sys.argv) > 7 else "full"
torch.set_num_threads(2)


def module_before(name: str):
    return common.module_before(before, name)


lm = load_model(model)
data = prompts(lm, ["prose", "code", "random", "chat"], per_source, 20, seed)
ids = torch.tensor([p for _, p in data])
tap = LayerTap(lm, layer)
states = tap.states(ids)
eps = tolerance_for(tap, {states.dtype}).eps  # measured, as the bench and the CLI do
engines = {name: SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config(calibration)), eps=eps)
           for name in (before, "now")}
old_cal = module_before("cache").load_cached(tap, module_before("config").calibration_config(calibration))
assert old_cal is not None, f"the calibration of {before} is not cached: run that commit once"
has_index = subprocess.run(["git", "cat-file", "-e", f"{before}:src/sipit/invert/learned/index.py"]).returncode == 0
extra = {}
if has_index:  # (index.py until 2fa4310; the earlier ranker.py imports it)
    sys.modules["sipit.invert.learned.index"] = index_before = module_before("index")
    extra = dict(index=index_before.load_or_build_index(old_cal))
engines[before].policy.ranker = module_before("ranker").LinearRanker(old_cal, tap, engines["now"].policy.ranker.screen_top,
                                                                    **extra)
for s in states[:2]:  # warm-up
    for e in engines.values():
        e.invert_prompt(s)

alone, forward = {name: [] for name in engines}, []
for i, (s, p) in enumerate(zip(states, ids)):
    t = time.perf_counter()
    tap.states(p)
    forward.append(time.perf_counter() - t)
    for name in (list(engines) if i % 2 else list(engines)[::-1]):
        r = engines[name].invert_prompt(s, p.tolist())
        assert r.ids == p.tolist() and r.status == "ok", (name, i, r.status)
        alone[name].append(r.seconds)
f = statistics.median(forward)
for name, sec in alone.items():
    print(f"layer {layer}, seed {seed}, {name}: one at a time median ratio {statistics.median(sec) / f:.2f}, "
          f"mean {statistics.mean(sec) / f:.2f} ({len(sec)} prompts)")

batch = list(range(min(32, len(ids))))
lock, batched = {name: [] for name in engines}, []
for rep in range(repeats):
    t = time.perf_counter()
    tap.states(ids[batch])
    batched.append(time.perf_counter() - t)
    for name in (list(engines) if rep % 2 else list(engines)[::-1]):
        t = time.perf_counter()
        res = engines[name].invert_prompts([states[j] for j in batch])
        lock[name].append(time.perf_counter() - t)
        assert all(r.ids == ids[j].tolist() for r, j in zip(res, batch))
for name, sec in lock.items():
    if sec:
        print(f"layer {layer}, seed {seed}, {name}: B = {len(batch)} median {statistics.median(sec):.2f} s, "
              f"÷ batched forward {statistics.median(sec) / statistics.median(batched):.2f} "
              f"(runs {[round(x, 2) for x in sec]}, batched forward {[round(x, 2) for x in batched]})")
