"""Position 0 under a fast calibration, on held-out first tokens: the first token of N spans of each source (the tokens
a captured window starts with), its position-0 state alone, and whether the fast ranker's position-0 guess is right
(as the loop guesses: a kept first token within its radius and the measured eps; by the radius alone; by the
linear position-0 model alone, as before the kept first tokens); where it
is not, the truth's place in a position-0 search's order (position0_order: the candidates tried before it;
the loop tries 16, then 64, then 256 a batch, each batch a pass). `tech` (the reference manual) is left out: the
calibration text.

    python first_token_fast.py MODEL LAYER SEED N        e.g. gemma3-270m 9 877 200"""
import dataclasses
import statistics
import sys

import torch

torch.set_num_threads(2)
from sipit import corpora
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.ranker import LinearRanker
from sipit.models import LayerTap, load_model

model, layer, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
SOURCES = [s for s in ("prose", "code", "chat", "fortunes", "wordnet", "random") if corpora.available()[s]]
lm = load_model(model)
tap = LayerTap(lm, layer)
eps = tolerance_for(tap, {torch.float32}).eps
ranker = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("fast")), eps=eps).policy.ranker
kept = getattr(ranker.cal, "first_ids", None) is not None
print(f"# python first_token_fast.py {' '.join(sys.argv[1:])}: {lm.name} layer {layer}, fast calibration "
      f"({f'{len(ranker.cal.first_ids)} first tokens kept' if kept else 'no first tokens kept'}), eps {eps:.3g}")
cal = ranker.cal
linear = LinearRanker(dataclasses.replace(cal, first_ids=None), tap) if kept else ranker  # the linear model alone
total = wrong_all = total_radius = total_linear = 0
for source in SOURCES:
    first = torch.tensor([p.ids[0] for p in corpora.sample(f"{source}:{n}", lm.tokenizer, 4, seed, lm.vocab_size)])
    Y = torch.cat([tap.states(v[:, None])[:, 0] for v in first.split(256)]).float()  # [n, d]
    guess = ranker.position0(Y, eps)[0]  # as the loop guesses (the kept first tokens within eps too, where kept)
    radius_alone = int((ranker.position0(Y)[0] != first).sum())
    linear_alone = int((linear.position0(Y)[0] != first).sum())
    wrong = (guess != first).nonzero()[:, 0].tolist()
    ranks = []
    for i in wrong:
        key = ranker.position0(Y[i:i + 1], eps)[1][0]
        order = ranker.position0_order(Y[i], key)
        ranks.append(int((order == first[i]).nonzero()[0, 0]))
    total, wrong_all = total + len(first), wrong_all + len(wrong)
    worst = sorted(zip(ranks, [lm.decode([int(first[i])]) for i in wrong]), reverse=True)[:3]
    if kept:  # wrong guesses that are kept tokens: under 100% of its radius another token's state inside it, else the
        #       linear model's guess
        for i in wrong:
            row = (cal.first_ids == guess[i]).nonzero()[:, 0]
            if len(row):
                d = float((Y[i].double() - cal.first_rows[row[0]].double()).norm())
                print(f"  {lm.decode([int(first[i])])!r} guessed as the kept {lm.decode([int(guess[i])])!r}: "
                      f"{d / float(Y[i].norm()):.2g} of the state's norm away, {d / float(cal.first_radius[row[0]]):.0%} "
                      f"of its radius")
    total_radius, total_linear = total_radius + radius_alone, total_linear + linear_alone
    print(f"{source:9s} {len(first)} first tokens ({len(set(first.tolist()))} distinct): {len(wrong)} guessed wrong "
          f"(by the kept states' radius alone: {radius_alone}, the linear model alone: {linear_alone}); "
          f"the truth's place in the search: median {statistics.median(ranks) if ranks else '-'}, "
          f"over 336 (more than the first three batches) {sum(r >= 336 for r in ranks)}; worst {worst}")
print(f"all: {wrong_all} of {total} wrong (by the radius alone: {total_radius}, the linear model alone: {total_linear}); "
      f"eps {eps:.3g}")
