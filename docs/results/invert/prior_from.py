"""The first guesses reading the LM head off the previous state (the LM prior at the last layer, the lens below it)
from position 1 (PRIOR_FROM = 1) and from position 2 (PRIOR_FROM = 2): prompts whose guesses read it, their wrong
guesses at position 1, and wrong guesses over every position of the set. Needs the ranker of f42d9c4..3e9f081, where
ranker.PRIOR_FROM existed (`git checkout 3e9f081 -- src/sipit/invert/learned/ranker.py`): it was reverted after
Qwen2.5-Coder-1.5B's last layer did worse with it (prior_from-qwen-28.txt); the ranker now reads it from position 1.

    python prior_from.py LAYER SEEDS [MODEL CALIBRATION]        e.g. 30 293,307,311,313 (SmolLM2, full)"""
import sys
from common import bench_prompts, ranker_at
from sipit.invert.learned import ranker as ranker_mod
from sipit.models import load_model
layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
model, calibration = (sys.argv[3:5] + ["smollm2", "full"][len(sys.argv[3:5]):])[:2]
lm = load_model(model)
tap, rk = ranker_at(lm, layer, calibration)


def reads_lm(h) -> bool:
    if rk.cal.has_prior:
        return rk.guesses([h])[0][1]
    top = rk.screen_best(rk.context_residuals(h))[0]
    return rk.cal.lens_w is not None and rk.lens_text_score(rk.lens_logits(h[:-1], top)) > rk.cal.lens_gate


for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    on = [i for i, h in enumerate(states) if reads_lm(h)]
    out = []
    for frm in (1, 2):
        ranker_mod.PRIOR_FROM = frm
        g = [guess for guess, _ in rk.guesses(states)]
        out.append(f"PRIOR_FROM={frm}: {'prior' if rk.cal.has_prior else 'lens'} on {len(on)}, wrong at position 1 "
                   f"{sum(int(g[i][0] != ids[i, 1]) for i in on)}, wrong in all {sum(int((x != p[1:]).sum()) for x, p in zip(g, ids))}")
    print(seed, " | ".join(out))
