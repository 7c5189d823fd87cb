"""A linear layer's product for a few rows, as torch computes it (F.linear: x @ Wᵀ, MKL's transposed-B path) against
(W @ xᵀ)ᵀ, on this machine (measured, not kept: docs/results/invert/README.md). Three parts, 2 threads:
  1. each of SmolLM2's weight shapes alone, 20 random matrices of it, medians of 5, per rows of x;
  2. measuring ε's noise (eps.measure_noise) at layers 15 and 30 with every nn.Linear of the model computed either way
     for inputs of at most ROWS rows (alternating, two repeats);
  3. the bench prompts of a seed inverted one at a time and a lock-step batch of 32 either way, with the forward each is
     compared with (the bench's: the same model, so computed the same way), every inversion exact.

    python small_products.py SEED        e.g. 1013"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from common import SOURCES, median_ms, smollm2
from sipit.bench.invert import interleaved, prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import measure_noise, tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

ROWS = 64
seed = int(sys.argv[1])
torch.set_num_threads(2)


print("1. ms a product, F.linear vs (W @ xT)T (20 matrices of each shape)")
for N, K in [(1536, 576), (576, 1536), (576, 576), (192, 576)]:
    Ws = [torch.randn(N, K) for _ in range(20)]
    for m in (1, 5, 20, 128, 640, 2048):
        x = torch.randn(m, K)
        a = median_ms(lambda: [F.linear(x, w) for w in Ws], 5) / 20
        b = median_ms(lambda: [(w @ x.T).T for w in Ws], 5) / 20
        print(f"  W [{N}, {K}], {m:4d} rows: {a:.3f} vs {b:.3f} ms ({a / b:.2f}x)")

plain = torch.nn.Linear.forward


def transposed(self, x):
    """(W @ xᵀ)ᵀ (+ bias) where x has at most ROWS rows in float32, else nn.Linear's own."""
    rows = x.numel() // x.shape[-1]
    if rows > ROWS or x.dtype != torch.float32:
        return plain(self, x)
    y = (self.weight @ x.reshape(rows, -1).T).T
    return (y if self.bias is None else y + self.bias).reshape(*x.shape[:-1], -1)


WAYS = (("F.linear", plain), ("(W @ xT)T", transposed))
lm = smollm2()
print(f"2. measure_noise, every nn.Linear either way for inputs of at most {ROWS} rows")
for layer in (15, 30):
    tap = LayerTap(lm, layer)
    for rep in range(2):
        for name, forward in WAYS:
            torch.nn.Linear.forward = forward
            t = time.perf_counter()
            noise = measure_noise(tap)
            print(f"  layer {layer} rep {rep} {name}: {time.perf_counter() - t:.2f} s, largest noise {max(noise):.3g}",
                  flush=True)
torch.nn.Linear.forward = plain

print(f"3. layer 15, the 40 bench prompts of seed {seed} one at a time (medians) and the first 32 in lock-step")
tap = LayerTap(lm, 15)
data = prompts(lm, SOURCES, 10, 20, seed)
ids = torch.tensor([data[i][1] for i in interleaved(data)])
states = tap.states(ids)
engine = SipIt(lm, 15, InvertConfig(policy="learned", learned=calibration_config("full")),
               eps=tolerance_for(tap, {states.dtype}).eps)
engine.invert_prompts(list(states[:4]))  # warm-up
for rep in range(2):
    for name, forward in WAYS:
        torch.nn.Linear.forward = forward
        forwards = [median_ms(lambda: tap.states(ids[i:i + 1]), 1) for i in range(40)]
        singles = []
        for i in range(40):
            t = time.perf_counter()
            result = engine.invert_prompt(states[i])
            singles.append(time.perf_counter() - t)
            assert result.ids == ids[i].tolist() and result.status == "ok", i
        f32 = median_ms(lambda: tap.states(ids[:32]), 1) / 1e3
        t = time.perf_counter()
        batch = engine.invert_prompts(list(states[:32]))
        b32 = time.perf_counter() - t
        assert all(r.ids == p.tolist() and r.status == "ok" for r, p in zip(batch, ids[:32]))
        print(f"  rep {rep} {name}: one at a time median {statistics.median(singles) * 1e3:.0f} ms (forward "
              f"{statistics.median(forwards):.1f} ms); B = 32 {b32:.2f} s (forward {f32:.3f} s, ratio "
              f"{b32 / f32:.2f})", flush=True)
torch.nn.Linear.forward = plain
