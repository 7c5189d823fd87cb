"""The lens gate's margin (an estimate, nothing inverted): per bench prompt its lens text score and its wrong first
guesses with the lens on and off, then, for gates lowered from the calibration's (random ids' 99th percentile +
gate_margin, 1 nat) by up to 1 nat (and "-99": the lens always on), the wrong guesses and the prompts with none
wrong (those that need one pass) by source.

    python lens_gate.py LAYER SEEDS        e.g. 15 5,1,7,13"""
import collections
import sys

import torch
from common import SOURCES, bench_prompts, ranker_at, smollm2

layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = smollm2()
tap, rk = ranker_at(lm, layer)
c = rk.cal
rows = []  # (source, text score, wrong guesses with the lens on, with it off)
for seed in seeds:
    data, _, states = bench_prompts(lm, tap, seed)
    for (kind, p), target in zip(data, states):
        top, scores = rk.screen_best(rk.context_residuals(target))
        logits = rk.lens_logits(target[:-1], top)
        on = top.gather(1, (scores + 2 * c.lm_weight * logits).argmax(1, keepdim=True))[:, 0]
        truth = torch.tensor(p[1:])
        rows.append((kind, rk.lens_text_score(logits), int((on != truth).sum()), int((top[:, 0] != truth).sum())))
print(f"layer {layer}, seeds {seeds}: the gate {c.lens_gate:.2f}")
for kind in SOURCES:
    print(f"  {kind} text scores", [round(x, 2) for x in sorted(r[1] for r in rows if r[0] == kind)])
for lower in (0.0, 0.25, 0.5, 0.75, 1.0, 99):
    wrong, none_wrong = collections.Counter(), collections.Counter()
    for kind, text, w_on, w_off in rows:
        w = w_on if text > c.lens_gate - lower else w_off
        wrong[kind] += w
        none_wrong[kind] += w == 0
    print(f"  gate lowered by {lower:4}: wrong {dict(wrong)}, {sum(wrong.values())} in all; prompts with none wrong "
          f"{dict(none_wrong)}, {sum(none_wrong.values())} in all")
