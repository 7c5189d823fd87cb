"""What a search pass of B one-token candidates costs on a 14-token prefix (flat and padded layouts; medians of 3):
whether a deep search would be cheaper in fewer, wider passes.

    python search_batch_cost.py LAYER        e.g. 30"""
import sys

import torch

from common import median_ms, smollm2
from sipit.models import LayerTap

layer = int(sys.argv[1])
tap = LayerTap(smollm2(), layer)
prefix = tap.prefill(torch.randint(100, 40000, (14,)))
for B in (64, 256, 512, 1024, 2048):
    rows = torch.randint(100, 40000, (B, 1))
    for layout in ("flat", "padded"):
        ms = median_ms(lambda: tap.extend(prefix, rows, layout=layout), 3)
        print(f"layer {layer}, {B} candidates on a 14-token prefix, {layout}: {ms:.0f} ms ({ms / B:.2f} ms each)", flush=True)
