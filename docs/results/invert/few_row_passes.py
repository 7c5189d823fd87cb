"""Passes of the tap with the blocks' linear layers as torch's x Wᵀ (stock) and as (W xᵀ)ᵀ (skinny: for 2..MAX_ROWS
rows, as skinny_products_ab.py), on a 17-token prefix: B rows of k new tokens, milliseconds (medians of 15), and the
largest relative difference of the states; then a forward of 1 and 32 prompts of 20 tokens (medians of 7).

    python few_row_passes.py LAYER MAX_ROWS        e.g. 15 64"""
import sys

import torch

from common import median_ms, smollm2
from sipit.models import LayerTap

layer, max_rows = int(sys.argv[1]), int(sys.argv[2])
tap = LayerTap(smollm2(), layer)
ids = torch.randint(100, 40000, (20,))
prefix = tap.prefill(ids[:17])
stock = torch.nn.Linear.forward


def skinny(self, x):
    n = x.numel() // x.shape[-1]
    if 2 <= n <= max_rows and x.dtype == torch.float32:
        y = (self.weight @ x.reshape(n, -1).T).T
        return (y if self.bias is None else y + self.bias).reshape(*x.shape[:-1], -1)
    return stock(self, x)


def timed(forward, f, repeats):
    torch.nn.Linear.forward = forward
    try:
        return median_ms(f, repeats), f()
    finally:
        torch.nn.Linear.forward = stock


for k, B in ((1, 1), (3, 1), (1, 3), (1, 8), (1, 16), (16, 1), (1, 64), (8, 16)):
    rows = torch.randint(100, 40000, (B, k))
    (a, ha), (b, hb) = (timed(fwd, lambda: tap.extend(prefix, rows), 15) for fwd in (stock, skinny))
    rel = float(((ha - hb).norm(dim=-1) / ha.norm(dim=-1)).max())
    print(f"rows {B} x {k} tokens: stock {a:.1f} ms, skinny {b:.1f} ms ({a / b:.2f}x), largest relative difference {rel:.1e}",
          flush=True)
for B in (1, 32):
    x = torch.randint(100, 40000, (B, 20))
    (a, _), (b, _) = (timed(fwd, lambda: tap.states(x), 7) for fwd in (stock, skinny))
    print(f"forward of {B} x 20 tokens: stock {a:.1f} ms, skinny {b:.1f} ms", flush=True)
