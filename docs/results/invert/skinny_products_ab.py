"""The blocks' linear layers as (W xᵀ)ᵀ for passes of 2..MAX_ROWS rows, against torch's x Wᵀ, in the loop's passes only
(the observation and the ratio's forward stay stock): the bench prompts of a seed one at a time or in lock-step
batches of B, alternating in one process (common.alternate), every inversion exact. On this project's AVX2-only AMD
EPYC, MKL packs the weight for few-row products, and (W xᵀ)ᵀ, whose small operand is the packed one, ran 1.5-2.8x
faster in isolation (4 rows of a [1,536 x 576] weight: 698 -> 252 us).

    python skinny_products_ab.py LAYER SEED B [MAX_ROWS]        e.g. 30 1063 1 32"""
import sys

import torch

import common

MAX_ROWS = int(sys.argv[4]) if len(sys.argv) > 4 else 32
stock = torch.nn.Linear.forward
on = [False]


def skinny(self, x):
    n = x.numel() // x.shape[-1]
    if on[0] and 2 <= n <= MAX_ROWS and x.dtype == torch.float32:
        y = (self.weight @ x.reshape(n, -1).T).T
        return (y if self.bias is None else y + self.bias).reshape(*x.shape[:-1], -1)
    return stock(self, x)


torch.nn.Linear.forward = skinny


def setting(value: bool):
    def apply(engine):
        if not hasattr(engine, "_stock_invert"):  # the switch is on inside the loop only
            engine._stock_invert = engine.invert_prompts

            def invert_prompts(*a, **k):
                on[0] = engine._skinny
                try:
                    return engine._stock_invert(*a, **k)
                finally:
                    on[0] = False
            engine.invert_prompts = invert_prompts
        engine._skinny = value
    return apply


layer, seed, B = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
common.alternate(layer, seed, 20, {"stock": setting(False), "skinny": setting(True)},
                 per_source=3 if B == 1 else 8, repeats=2 if B == 1 else 4, B=B)
