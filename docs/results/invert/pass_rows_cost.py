"""What a pass costs by its rows and new tokens after a 5-token prefix (tap.extend_many, medians of 7), against a
forward of 20 tokens: how much a pass's fixed cost (the model's weights read once) outweighs its tokens.

    python pass_rows_cost.py LAYER        e.g. 30"""
import sys

import torch

import common

from sipit.models import LayerTap

layer = int(sys.argv[1])
lm = common.smollm2()
tap = LayerTap(lm, layer)
ids = torch.randint(0, lm.vocab_size, (40,))
forward = common.median_ms(lambda: tap.states(ids[:20]))
prefix = tap.prefill(ids[:5])
print(f"layer {layer}: forward of 20 tokens {forward:.1f} ms")
for n, k in [(1, 1), (1, 5), (1, 15), (2, 15), (4, 15), (8, 15), (16, 15), (16, 1), (64, 1), (1, 15)]:
    rows = torch.randint(0, lm.vocab_size, (n, k))
    ms = common.median_ms(lambda: tap.extend_many([(prefix, rows)]))
    print(f"  {n} x {k} = {n * k} tokens after 5: {ms:.1f} ms ({ms / forward:.2f} forwards)")
