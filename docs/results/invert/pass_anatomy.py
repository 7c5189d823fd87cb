"""Inside one pass: what a tap.extend of n new tokens on a 10-token prefix costs (medians of 7), and, for a row of
20 guesses and a search batch of 256 one-token candidates, each operator's share of the pass (torch.profiler, self CPU
time over 5 passes): the weights' products (aten::mm), the attention kernel, the rest (norms, rotary, activations,
cache copies). Then the products alone: the model's seven weight matrices a block, for the blocks the tap runs, as
plain torch.nn.functional.linear calls on 1 and 20 rows, and their GFLOP/s.

    python pass_anatomy.py LAYER        e.g. 30"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from common import median_ms, smollm2
from sipit.models import LayerTap

layer = int(sys.argv[1])
lm = smollm2()
tap = LayerTap(lm, layer)
g = torch.Generator().manual_seed(0)
prefix = tap.prefill(torch.randint(0, lm.vocab_size, (10,), generator=g))


def ms(f) -> float:
    f()  # (a warm-up call)
    return median_ms(f)


costs = {n: ms(lambda n=n: tap.extend(prefix, torch.randint(0, lm.vocab_size, (1, n), generator=g)))
         for n in (1, 4, 10, 20, 40)}
print(f"layer {layer}: a pass of n new tokens on a 10-token prefix, ms: " +
      ", ".join(f"{n}: {c:.1f}" for n, c in costs.items()))
for name, rows in (("a row of 20 guesses", torch.randint(0, lm.vocab_size, (1, 20), generator=g)),
                   ("256 one-token candidates", torch.randint(0, lm.vocab_size, (256, 1), generator=g))):
    tap.extend(prefix, rows)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            tap.extend(prefix, rows)
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(ops.values())
    attention = sum(v for k, v in ops.items() if "attention" in k)
    print(f"  {name}: {total / 5e3:.1f} ms a pass; products (aten::mm) {ops.get('aten::mm', 0) / total:.0%}, "
          f"attention {attention / total:.0%}, the rest {1 - (ops.get('aten::mm', 0) + attention) / total:.0%}")
weights = [m.weight for block in lm.blocks[:tap.blocks_read] for m in block.modules()
           if isinstance(m, torch.nn.Linear)]
params = sum(w.numel() for w in weights)
for n in (1, 20):
    x = {k: torch.randn(n, k) for k in {w.shape[1] for w in weights}}  # (inputs of each width)
    t = ms(lambda: [torch.nn.functional.linear(x[w.shape[1]], w) for w in weights])
    print(f"  the {len(weights)} weight products alone ({params / 1e6:.0f} M parameters), {n} row(s): {t:.1f} ms, "
          f"{2 * params * n / t / 1e6:.0f} GFLOP/s")
