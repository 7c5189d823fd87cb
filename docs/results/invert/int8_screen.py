"""Dynamic int8 linear layers (torch.ao quantize_dynamic: int8 weights, per-tensor activations) as a screen for a deep
search's candidates: one candidate batch of N random tokens with the true one among them, after 3 and 14 tokens of
2 bench prompts a source, through SmolLM2 in float32 and in int8 (medians of 3 on every other prompt): the truth's
rank by int8 distance, its int8 and the next float32 candidate's distance, the int8 states' median error.

    python int8_screen.py LAYER SEED N        e.g. 30 1069 512"""
import copy
import sys

import torch

from common import bench_prompts, median_ms, smollm2
from sipit.models import LayerTap
from sipit.models.lm import LM

layer, seed, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
lm = smollm2()
int8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(lm.model), {torch.nn.Linear}, dtype=torch.qint8)
lq = LM(lm.name, int8, lm.tokenizer, precision=lm.precision, full_layers=lm.full_layers)
tap, tap8 = LayerTap(lm, layer), LayerTap(lq, layer)
data, ids, states = bench_prompts(lm, tap, seed, per_source=2)
g = torch.Generator().manual_seed(5)
for k, (source, _) in enumerate(data):
    for t in (3, 14):
        prefix, prefix8 = tap.prefill(ids[k, :t]), tap8.prefill(ids[k, :t])
        candidates = torch.randint(lm.vocab_size, (N,), generator=g)
        candidates[7] = ids[k, t]
        h, h8 = tap.extend(prefix, candidates, layout="padded"), tap8.extend(prefix8, candidates, layout="padded")
        observed = states[k][t]
        d, d8 = ((x - observed).norm(dim=-1) / observed.norm() for x in (h, h8))
        error = float(((h8 - h).norm(dim=-1) / h.norm(dim=-1)).median())
        line = (f"{source:6s} t={t:2d}: truth's int8 rank {int((d8 < d8[7]).sum())}, its int8 distance "
                f"{float(d8[7]):.3f}, the next float32 candidate's {float(d.sort().values[1]):.3f}, int8 error (median) "
                f"{error:.3f}")
        if k % 2 == 0:
            ms = [median_ms(lambda: tp.extend(p, candidates, layout="padded"), 3)
                  for tp, p in ((tap, prefix), (tap8, prefix8))]
            line += f"; float32 {ms[0]:.0f} ms, int8 {ms[1]:.0f} ms"
        print(line, flush=True)
