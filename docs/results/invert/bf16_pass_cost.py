"""What a pass costs in float32 and on a bfloat16 copy of the model (draft_loop.py's draft): 1 / 4 / 10 / 20 new
tokens in one row and 256 one-token candidates, on a 10-token prefix (medians of 9, of 5 for the candidates); then
one [rows × 576] · [576 × 1,536] product alone, float32 against bfloat16 (medians of 200).

    python bf16_pass_cost.py LAYER        e.g. 30"""
import sys

import torch

import common
from common import median_ms
from sipit.models import LayerTap

layer = int(sys.argv[1])
lm = common.smollm2()
ids = torch.randint(0, lm.vocab_size, (30,), generator=torch.Generator().manual_seed(0))
candidates = torch.randint(0, lm.vocab_size, (256, 1), generator=torch.Generator().manual_seed(1))
for name, model in (("float32", lm), ("bfloat16", lm.copy_in(torch.bfloat16))):
    tap = LayerTap(model, layer)
    prefix = tap.prefill(ids[:10])
    tap.extend(prefix, candidates)  # (warm-up)
    rows = [f"{k} tokens {median_ms(lambda: tap.extend(prefix, ids[10:10 + k][None]), 9):.1f} ms"
            for k in (1, 4, 10, 20)]
    rows.append(f"256 candidates {median_ms(lambda: tap.extend(prefix, candidates), 5):.1f} ms")
    print(f"layer {layer}, {name}: " + ", ".join(rows), flush=True)
W = torch.randn(1536, 576)
Wb = W.bfloat16()
for n in (1, 4, 20):
    x = torch.randn(n, 576)
    xb = x.bfloat16()
    torch.nn.functional.linear(xb, Wb)  # (warm-up)
    fp32 = median_ms(lambda: torch.nn.functional.linear(x, W), 200)
    bf16 = median_ms(lambda: torch.nn.functional.linear(xb, Wb), 200)
    print(f"[{n} × 576] · [576 × 1,536]: float32 {1e3 * fp32:.0f} µs, bfloat16 {1e3 * bf16:.0f} µs")
