"""Measured, not built: the whole SipIt loop first on a bfloat16 copy of the model (acceptance at DRAFT_EPS, a
search giving up after MAX candidates, no certificates), then the float32 engine with the draft's ids as its first
guesses (one pass verifies them where they are right), against the float32 engine alone: each prompt both ways,
alternating which goes first, every inversion exact and `ok`. Ratios to the prompt's own forward.

    python draft_loop.py LAYER SEED DRAFT_EPS MAX N        e.g. 30 929 0.1 1024 16 (the first N bench prompts)"""
import copy
import importlib
import statistics
import sys
import time
from dataclasses import replace

import torch

import common
from sipit.bench.invert import _forward_seconds, interleaved
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.policy import Learned
from sipit.models import LayerTap

policies = importlib.import_module("sipit.invert.policies")  # (sipit.invert.invert, a function, hides the package)
layer, seed, most, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5])
draft_eps = float(sys.argv[3])
lm = common.smollm2()
tap = LayerTap(lm, layer)
data, ids, states = common.bench_prompts(lm, tap, seed)
cfg = InvertConfig(policy="learned", learned=calibration_config("full"))
exact = SipIt(lm, layer, cfg, eps=tolerance_for(tap, {states[0].dtype}).eps)
make_policy = policies.make_policy
policies.make_policy = lambda *_: copy.copy(exact.policy)  # the draft ranks with the float32 engine's calibration
draft = SipIt(tap=LayerTap(lm.copy_in(torch.bfloat16), layer), config=replace(cfg, max_candidates=most), eps=draft_eps)
policies.make_policy = make_policy
draft.certifier.wanted = lambda *_, **__: []  # (no certificates: its tokens are only guesses)
draft._full_length = lambda *_: (float("inf"), None)  # (no full-length recheck at a draft's ε)
forced = []  # the draft's ids, guessed first by the float32 engine's policy
begin_many = Learned.begin_many


def begin_forced(self, targets, costs, into=None):
    out = begin_many(self, targets, costs, into)
    for p in out if forced else []:
        p.guess = torch.cat([forced[0], p.guess[len(forced[0]):]])
    return out


Learned.begin_many = begin_forced


def drafted(i: int):
    """(seconds, the float32 result, bfloat16 passes, ids the draft recovered)"""
    t = time.perf_counter()
    rd = draft.invert_prompt(states[i].float())
    got = torch.tensor([q.token for q in rd.positions if q.token is not None], dtype=torch.long)
    forced.append(got)
    r = exact.invert_prompt(states[i], ids[i].tolist())
    forced.clear()
    return time.perf_counter() - t, r, rd.tap_calls, len(got)


def alone(i: int):
    t = time.perf_counter()
    r = exact.invert_prompt(states[i], ids[i].tolist())
    return time.perf_counter() - t, r


order = interleaved(data)[:n]
alone(order[0]), drafted(order[0])  # warm-up
rows = []
for k, i in enumerate(order):
    fwd = _forward_seconds(tap, ids[i:i + 1])
    if k % 2:
        (t0, r0), (t1, r1, passes, got) = alone(i), drafted(i)
    else:
        (t1, r1, passes, got), (t0, r0) = drafted(i), alone(i)
    assert r0.exact and r1.exact and r0.status == r1.status == "ok"
    rows.append((t0 / fwd, t1 / fwd))
    print(f"{data[i][0]:7s} float32 {t0 / fwd:6.2f} ({r0.tap_calls} passes)  drafted {t1 / fwd:6.2f} ({passes} "
          f"bfloat16 passes, {got} of 20 ids, then {r1.tap_calls} float32)", flush=True)
print(f"SmolLM2 layer {layer}, seed {seed}, {n} prompts, draft ε {draft_eps}, at most {most} candidates a position: "
      f"median ratio float32 {statistics.median(r[0] for r in rows):.2f}, "
      f"drafted {statistics.median(r[1] for r in rows):.2f}; "
      f"mean {statistics.mean(r[0] for r in rows):.2f} / {statistics.mean(r[1] for r in rows):.2f}")
