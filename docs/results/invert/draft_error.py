"""Where the bfloat16 draft is wrong about the true token: each bench prompt's true ids through the draft
(LayerTap on lm.copy_in(bfloat16)) against the float32 observation, position by position. In a search the
draft's prefix is the verified (true) one, so this is exactly the true token's draft distance at every position.

    python draft_error.py LAYER SEEDS        e.g. 30 269,1,271,277

Prints the positions t ≥ 1 whose relative distance exceeds 0.08 (the draft's DRAFT_NEAR is 0.1) with the
observation's norm (÷ the prompt's median) and the largest distance at the positions before, then quantiles."""
import statistics
import sys

import torch

from common import LayerTap, bench_prompts, smollm2
from sipit.invert.verify import rel_distance

layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
lm = smollm2()
tap, draft = LayerTap(lm, layer), LayerTap(lm.copy_in(torch.bfloat16), layer)
errors = []
print("seed source prompt t: distance, norm ÷ median, largest distance at 1..t-1")
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    drafted = draft.states(ids).float()
    for i, (source, _) in enumerate(data):
        e = rel_distance(drafted[i], states[i]).tolist()  # [20]
        norms = states[i].norm(dim=1)
        for t in range(1, len(e)):
            errors.append(e[t])
            if e[t] > 0.08:
                before = max(e[1:t], default=float("nan"))
                print(f"{seed} {source} {i} {t}: {e[t]:.3f}, {float(norms[t] / norms[1:].median()):.2f}, {before:.3f}")
q = statistics.quantiles(errors, n=1000)
print(f"layer {layer}, {len(errors)} positions t >= 1: median {statistics.median(errors):.4f}, 99% {q[989]:.4f}, "
      f"99.9% {q[998]:.4f}, max {max(errors):.4f}; > 0.1 at {sum(x > 0.1 for x in errors)}")
