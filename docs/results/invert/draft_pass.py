"""Groundwork for a bfloat16 draft of deep searches: a search pass of 256 one-token candidates after a prefix, in
the model's float32 and in a bfloat16 copy (lm.copy_in), and how well the copy's distances separate the true token
from the others. For N random-id prefixes (5 tokens) and bench-like text ones, the true next token sits among 255
random others: prints the passes' milliseconds (medians of 5) and, over the N, the true token's bfloat16 relative
distance (max) against the closest other's (min), float32 for reference.

    python draft_pass.py LAYERS N      e.g. 15,30 8"""
import statistics
import sys

import torch

from common import bench_prompts, median_ms, smollm2
from sipit.invert.verify import rel_distance
from sipit.models import LayerTap

layers, n = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2])
lm = smollm2()
low = lm.copy_in(torch.bfloat16)
g = torch.Generator().manual_seed(0)
_, text, _ = bench_prompts(lm, LayerTap(lm, 1), 251, 2)
for layer in layers:
    tap, draft = LayerTap(lm, layer), LayerTap(low, layer)
    times, true_low, other_low, other_full = {"float32": [], "bfloat16": []}, [], [], []
    for i in range(n):
        ids = text[i % len(text), :6] if i % 2 else torch.randint(0, lm.vocab_size, (6,), generator=g)
        rows = torch.randint(0, lm.vocab_size, (256, 1), generator=g)
        rows[7, 0] = ids[5]
        target = tap.states(ids)[5]
        p, q = tap.prefill(ids[:5]), draft.prefill(ids[:5])
        times["float32"].append(median_ms(lambda: tap.extend(p, rows), 5))
        times["bfloat16"].append(median_ms(lambda: draft.extend(q, rows), 5))
        d, dl = rel_distance(tap.extend(p, rows)[:, 0], target), rel_distance(draft.extend(q, rows)[:, 0].float(), target)
        others = (rows[:, 0] != ids[5])
        true_low.append(float(dl[7]))
        other_low.append(float(dl[others].min()))
        other_full.append(float(d[others].min()))
    print(f"layer {layer}: 256 candidates float32 {statistics.median(times['float32']):.0f} ms, bfloat16 "
          f"{statistics.median(times['bfloat16']):.0f} ms; the true token's bfloat16 distance median "
          f"{statistics.median(true_low):.3f}, max {max(true_low):.3f}; the closest other's bfloat16 min {min(other_low):.3f} "
          f"(float32 {min(other_full):.3f})", flush=True)
