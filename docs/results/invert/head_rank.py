"""The LM prior's screen at the last layer, its rank chosen by agreement (the fit's _lm_prior) against the fixed rank
of an earlier commit: the bench prompts' wrong first guesses (positions 1-19, per source) and the guesses'
milliseconds a prompt where the prior is on (median), each commit's ranker with its own calibration (the earlier one
cached already: run that commit once). Nothing inverted.

    python head_rank.py BEFORE LAYER SEEDS [MODEL CALIBRATION]        e.g. 4e56525 30 683,691,701"""
import statistics
import sys
import time

import torch

from common import SOURCES, module_before
from sipit.bench.invert import prompts
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.fit import load_or_calibrate
from sipit.invert.learned.ranker import LinearRanker
from sipit.models import LayerTap, load_model

before, layer, seeds = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
model, mode = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else ("smollm2", "full")
lm = load_model(model)
tap = LayerTap(lm, layer)
old_cal = module_before(before, "cache").load_cached(tap, module_before(before, "config").calibration_config(mode))
assert old_cal is not None, f"the calibration of {before} is not cached: run that commit once"
cal, _ = load_or_calibrate(tap, calibration_config(mode))
cfg = calibration_config(mode)
rankers = {before: module_before(before, "ranker").LinearRanker(old_cal, tap, cfg.screen_top, guess_top=cfg.guess_top),
           "now": LinearRanker(cal, tap, cfg.screen_top, guess_top=cfg.guess_top)}
print(f"{model} layer {layer} ({mode}): head screen rank {before} {old_cal.u_basis.shape[1]}, now {cal.u_basis.shape[1]}; "
      f"gate {old_cal.lm_gate:.2f} / {cal.lm_gate:.2f}")
sets = []
for seed in seeds:
    data = prompts(lm, SOURCES, 10, 20, seed)
    sets.append((data, [s.float() for s in tap.states(torch.tensor([p for _, p in data]))]))
wrong = {name: {s: 0 for s in SOURCES} for name in rankers}
on = {name: {s: 0 for s in SOURCES} for name in rankers}
ms = {name: [] for name in rankers}
for data, states in sets:
    for (source, p), h in zip(data, states):
        for name, ranker in rankers.items():
            t = time.perf_counter()
            guess, prior = ranker.guesses([h])[0]
            if prior:
                ms[name].append(time.perf_counter() - t)
            wrong[name][source] += int((guess != torch.tensor(p[1:])).sum())
            on[name][source] += prior
for name in rankers:
    print(f"  {name}: wrong first guesses {wrong[name]} (of {19 * 10 * len(seeds)} each; text "
          f"{sum(v for s, v in wrong[name].items() if s != 'random')}), prior on for {on[name]} prompts; "
          f"{statistics.median(ms[name]) * 1e3:.1f} ms a prompt's guesses with the prior")
