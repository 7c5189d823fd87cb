"""How far a state at position 1 moves with the length of the forward that computes it (float32, 2 threads): the
random-id prompt of fresh seed 809 that failed at layer 30 before 72cf1c6 (prompt 22 of the bench's order: its
position 1 after the token 46189), per layer, 20 tokens against 2; at layer 30 through the loop's paths (a cache, one
row or batches, flat or padded) and a 20-token forward with other tokens after it; then the same continuation after 64
other random first tokens; then 512 uniform random-id prompts in batches of 32, 20 tokens against 2, 3 and 4, at
layers 15 and 30 against their measured ε (eps.py).

    python length_noise.py"""
import torch

import common

from sipit.bench.invert import prompts
from sipit.invert.eps import tolerance_for
from sipit.models import LayerTap


def rel(a, b):
    return ((a - b).norm(dim=-1) / b.norm(dim=-1))


lm = common.smollm2()
x = torch.tensor(prompts(lm, common.SOURCES, 10, 20, 809)[22][1])
print(f"seed 809 prompt 22 (random ids, first tokens {x[:3].tolist()}), position 1, a 20-token forward against a "
      "2-token one:")
for layer in (1, 5, 10, 15, 20, 25, 28, 29, 30):
    tap = LayerTap(lm, layer)
    print(f"  layer {layer:2d}: {float(rel(tap.states(x[None])[0, 1], tap.states(x[None, :2])[0, 1])):.1e} "
          f"(ε {tolerance_for(tap, {torch.float32}).eps:.1e})")
tap = LayerTap(lm, 30)
observed, prefix = tap.states(x[None])[0, 1], tap.prefill(x[:1])
paths = {"a 20-token forward, other tokens after position 1": tap.states(torch.cat([x[:2], x[2:].flip(0)])[None])[0, 1],
         "a 2-token forward": tap.states(x[None, :2])[0, 1],
         "the cache of position 0, one row": tap.extend(prefix, x[1:2])[0]}
for n in (16, 256):
    rows = torch.cat([x[1:2], torch.randint(0, lm.vocab_size, (n - 1,), generator=torch.Generator().manual_seed(n))])
    for layout in ("flat", "padded"):
        paths[f"the cache, {n} candidates, {layout}"] = tap.extend(prefix, rows[:, None], layout=layout)[0, 0]
print("layer 30, the same prompt's position 1 (its true token) against the observation (a 20-token forward):")
for name, h in paths.items():
    print(f"  {name}: {float(rel(h, observed)):.1e}")
firsts = torch.randint(0, lm.vocab_size, (64,), generator=torch.Generator().manual_seed(1)).tolist() + [int(x[0])]
moved = sorted(((float(rel(tap.states(y[None])[0, 1], tap.states(y[None, :2])[0, 1])), v)
                for v in firsts for y in [torch.cat([torch.tensor([v]), x[1:]])]), reverse=True)
print("layer 30, the same continuation after 65 first tokens (64 random + 46189): the largest",
      [(f"{m:.1e}", v) for m, v in moved[:4]], f"median {moved[32][0]:.1e}")
X = torch.randint(0, lm.vocab_size, (512, 20), generator=torch.Generator().manual_seed(7))
for layer in (15, 30):
    tap = LayerTap(lm, layer)
    eps = tolerance_for(tap, {torch.float32}).eps
    full = torch.cat([tap.states(X[i:i + 32]) for i in range(0, 512, 32)])
    for k in (2, 3, 4):
        short = torch.cat([tap.states(X[i:i + 32, :k]) for i in range(0, 512, 32)])
        r = rel(full[:, :k], short)
        print(f"layer {layer}, 512 random-id prompts in batches of 32, 20 tokens against {k}: positions over ε "
              f"{int((r > eps).sum())} of {r.numel()}, largest {float(r.max()):.1e} (ε {eps:.1e})")
