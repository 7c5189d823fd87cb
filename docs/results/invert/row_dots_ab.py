"""row_dots, the ranker's exact scores of a few candidates per row (the P rows of the guesses' shortlists, the LM head's
rows of the lens and prior): gathered by index_select in blocks of 16 rows (before) against torch.sparse.sampled_addmm
(now). First the product alone on SmolLM2's [49,152, 576] P, shapes of a prompt (19 rows x 16), a lock-step batch
(608 x 64) and a search ranking (4 x 1,024); then inside the loop: the bench prompts of a seed, inverted alone (each
prompt's seconds / its forward, medians) and in lock-step batches of B (the batch's seconds / its batched forward),
the two versions alternating in one process, every inversion exact.

    python row_dots_ab.py LAYER SEED B REPEATS        e.g. 15 1297 32 5"""
import importlib
import statistics
import sys
import time

import torch

from common import SOURCES, bench_prompts, median_ms, smollm2
from sipit.bench.invert import interleaved
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

ranker = importlib.import_module("sipit.invert.learned.ranker")  # (the module, whose row_dots is swapped)
layer, seed, B, repeats = (int(a) for a in sys.argv[1:5])
now = ranker.row_dots


def gathered(table, ids, x, rows=16):
    """row_dots before: index_select in blocks of rows, then a batched product."""
    k = table.shape[1]
    return torch.cat([(table.index_select(0, i.reshape(-1)).view(*i.shape, k) @ v[:, :, None])[..., 0]
                      for i, v in zip(ids.split(rows), x.split(rows))]) if len(ids) else x.new_zeros(ids.shape)


lm = smollm2()
tap = LayerTap(lm, layer)
data, ids, states = bench_prompts(lm, tap, seed)
engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
               eps=tolerance_for(tap, {torch.float32}).eps)
P = engine.policy.ranker.cal.P
g = torch.Generator().manual_seed(0)
for n, m in [(19, 16), (608, 64), (4, 1024)]:
    rows, x = torch.randint(0, len(P), (n, m), generator=g), torch.randn(n, P.shape[1], generator=g)
    exact = (P.double()[rows] * x.double()[:, None]).sum(-1)
    errs = [float((f(P, rows, x).double() - exact).abs().max()) for f in (gathered, now)]
    print(f"{n} x {m}: gathered {median_ms(lambda: gathered(P, rows, x)):.3f} ms (error {errs[0]:.1e}), "
          f"sampled_addmm {median_ms(lambda: now(P, rows, x)):.3f} ms (error {errs[1]:.1e})")

order = interleaved(data)
batches = [order[i:i + B] for i in range(0, len(order) - B + 1, B)]
results = {"before": ([], []), "now": ([], [])}
for r in range(repeats):
    for name, f in (("before", gathered), ("now", now)) if r % 2 == 0 else (("now", now), ("before", gathered)):
        ranker.row_dots = f
        alone, batched = results[name]
        for i in range(len(states)):
            forward = median_ms(lambda: tap.states(ids[i:i + 1]), 3)
            t = time.perf_counter()
            res = engine.invert_prompt(states[i], ids[i].tolist())
            alone.append((time.perf_counter() - t) * 1e3 / forward)
            assert res.ids == ids[i].tolist(), (name, i)
        for batch in batches:
            forward = median_ms(lambda: tap.states(ids[batch]), 3)
            t = time.perf_counter()
            out = engine.invert_prompts([states[i] for i in batch], [ids[i].tolist() for i in batch])
            batched.append((time.perf_counter() - t) * 1e3 / forward)
            assert all(o.ids == ids[i].tolist() for o, i in zip(out, batch)), name
ranker.row_dots = now
print(f"layer {layer}, seed {seed}, {len(states)} prompts ({', '.join(SOURCES)}), {repeats} repeats alternating:")
for name, (alone, batched) in results.items():
    print(f"  {name:6s} alone: median ratio {statistics.median(alone):.3f}; B = {B}: median ratio "
          f"{statistics.median(batched):.3f} ({', '.join(f'{x:.2f}' for x in batched)})")
