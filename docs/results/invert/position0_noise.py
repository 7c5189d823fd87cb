"""Whether position 0's certified lower bounds could exclude a genuine prompt's first token: the bounds come from
the calibration's table (every token's state at position 0, computed once, stored in float16) and exclude a token
from the search when above ε, before any pass evaluates it, so the full-length check (sipit.NEAR) never sees it.
Position 1 of a state moves with the length of the forward that computes it (length_noise.py); here, N distinct random
first tokens, each followed by random ids to LENGTH tokens, through forwards of B prompts (as a user's capture would
make them), and each first token's bound (LinearRanker.position0) against ε. Prints the largest bounds and relative
distances to the table of the true tokens, how many bounds exceed ε, and how many table guesses are wrong.

    python position0_noise.py LAYER N LENGTH B        e.g. 30 1024 20 32"""
import sys

import torch

import common

from sipit.invert.eps import tolerance_for

layer, n, length, B = (int(x) for x in sys.argv[1:5])
lm = common.smollm2()
tap, ranker = common.ranker_at(lm, layer)
g = torch.Generator().manual_seed(99)
first = torch.randperm(lm.vocab_size, generator=g)[:n]
ids = torch.cat([first[:, None], torch.randint(0, lm.vocab_size, (n, length - 1), generator=g)], 1)
eps = tolerance_for(tap, {torch.float32}).eps
rows = []  # (bound, relative distance, token, guessed right)
for i in range(0, n, B):
    Y = tap.states(ids[i:i + B])[:, 0].float()  # [b, d]
    guess, rel, bounds = ranker.position0(Y)
    v = ids[i:i + B, :1]
    rows += zip(bounds.gather(1, v)[:, 0].tolist(), rel.gather(1, v)[:, 0].tolist(), v[:, 0].tolist(),
                (guess == v[:, 0]).tolist())
rows.sort(reverse=True)
print(f"layer {layer}: {n} first tokens, {length}-token prompts in forwards of {B}; ε {eps:.2e}, table "
      f"{ranker.cal.table.dtype} (storage slack {ranker.table_err:.2e})")
print("  the largest bounds (relative distance to the table) of the true tokens:",
      ", ".join(f"{b:.1e} ({r:.1e}, {v})" for b, r, v, _ in rows[:4]))
print(f"  largest relative distance {max(r for _, r, _, _ in rows):.2e}; bounds over ε: "
      f"{sum(b > eps for b, *_ in rows)} of {n}; table guesses wrong: {sum(not ok for *_, ok in rows)}")
