"""Layer 15's wrong first guesses and why the lens did not fix them (nothing inverted): per bench prompt the guesses
from its observed states, and for each wrong one the previous and true tokens, the guess, and whether the truth was
among the screen's best (those the lens re-ranks), the lens was off (the prompt's text score at or below the gate),
or on but short: the lens logit favouring the wrong token, or the truth by less than the linear scores favour the
guess (then the lens weight that would have been needed, against the calibration's lm_weight).

    python lens_misses.py LAYER SEEDS        e.g. 15 1,7,13"""
import collections
import sys

from common import bench_prompts, ranker_at, smollm2

layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = smollm2()
tap, rk = ranker_at(lm, layer)
c = rk.cal
print(f"layer {layer}, seeds {seeds}: lm_weight {c.lm_weight}, lens gate {c.lens_gate:.2f}, screen's best {rk.screen_top}")
wrong, positions, why = collections.Counter(), collections.Counter(), collections.Counter()
for seed in seeds:
    data, _, states = bench_prompts(lm, tap, seed)
    for (kind, p), target in zip(data, states):
        top, scores = rk.screen_best(rk.context_residuals(target))
        logits = rk.lens_logits(target[:-1], top)
        text = rk.lens_text_score(logits)
        guess = rk.lens_guesses([target], top, scores)[0]
        positions[kind] += len(p) - 1
        for t in range(1, len(p)):
            g, truth = int(guess[t - 1]), p[t]
            if g == truth:
                continue
            wrong[kind] += 1
            row = top[t - 1].tolist()
            if truth not in row:
                reason, detail = "not in the screen's best", ""
            else:
                j, i = row.index(truth), row.index(g)
                ds, dl = float(scores[t - 1, i] - scores[t - 1, j]), float(logits[t - 1, j] - logits[t - 1, i])
                if text <= c.lens_gate:
                    reason = "lens off"
                elif dl <= 0:
                    reason = "lens on, prefers the guess"
                else:
                    reason = "lens on, too weak"
                detail = (f"text score {text:.2f}, truth {j}th of the best, score gap {ds:.1f}, lens logit gap {dl:.2f}"
                          + (f", weight needed {ds / (2 * dl):.1f}" if dl > 0 else ""))
            why[reason] += 1
            print(f"{seed} {kind:6s} {t:2d} after {lm.decode(p[t - 1:t])!r}: {lm.decode([truth])!r} guessed "
                  f"{lm.decode([g])!r}: {reason}{'; ' + detail if detail else ''}")
print("wrong:", {k: f"{wrong[k]}/{positions[k]}" for k in positions})
print("why:", dict(why))
