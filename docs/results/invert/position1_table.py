"""The full calibration's token feature from position 1 instead of position 0 (an estimate, nothing inverted): the
forward model h_t ≈ A [e_v, table_v] + B ĥ_{t−1} + c reads table_v, token v's state at position 0. Deep in the
model position 0 is a sink, unlike any later position, so the state of v at position 1 after a fixed first token
(a newline) may describe v in context better. Three calibrations of the same layer, fitted alike but for the
feature: position 0's table (the cached one), position 1's in its place, and both side by side; then, on the bench
prompts of the seeds given (10 a source, 20 tokens), the wrong first guesses at positions 1..19 (first_look, as the
loop speculates) by source and the true token's rank by the main scores (no anchors). Position 0 is left out: its
distances need position 0's own table.

    python position1_table.py LAYER SEEDS        e.g. 30 1019,1021"""
import sys
import time

import torch
from common import bench_prompts, ranker_at, smollm2

from sipit.invert.learned import fit
from sipit.invert.learned.config import LearnedConfig
from sipit.invert.learned.ranker import LinearRanker
from sipit.models import LayerTap

layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
torch.set_num_threads(2)
lm = smollm2()
first = lm.encode("\n")[-1]
tap, cached = ranker_at(lm, layer)
position0_tables = fit.position0_tables
tables = {}  # "p0" / "p1" -> [V, d], computed once for both fits


def position1_tables(observe, V, device, batch=1024, desc=""):
    """Every token's state at position 1 after `first` ([first, v] rows), in position0_tables' form."""
    parts = []
    for i in range(0, V, batch):
        v = torch.arange(i, min(V, i + batch), device=device)
        parts.append(observe(torch.stack([torch.full_like(v, first), v], 1)))
    return [torch.cat([p[j][:, 1].float() for p in parts]) for j in range(len(parts[0]))]


def feature(kind):
    def tables_of(observe, V, device, batch=1024, desc=""):
        if "p0" not in tables:
            t = time.perf_counter()
            tables["p0"] = position0_tables(observe, V, device, batch, desc)[0]
            tables["p1"] = position1_tables(observe, V, device, batch, desc)[0]
            print(f"tables {time.perf_counter() - t:.0f} s", flush=True)
        return [tables["p1"] if kind == "p1" else torch.cat([tables["p0"], tables["p1"]], 1)]
    return tables_of


def measure(ranker, name):
    for seed in seeds:
        data, ids, states = bench_prompts(lm, tap, seed)
        wrong, ranks = {}, []
        for (source, _), row, target, (guess, prior) in zip(data, ids, states, ranker.guesses(states)):
            wrong[source] = wrong.get(source, 0) + int((guess != row[1:]).sum())
            for t in range(1, len(row)):
                s = ranker.scores(target, t, prior)
                ranks.append(int((s > s[row[t]]).sum()))
        ranks = torch.tensor(ranks)
        print(f"{name:16s} seed {seed}: wrong first guesses {sum(wrong.values()):3d} of {len(ranks)} {wrong}; true token's "
              f"rank ≥ 16: {int((ranks >= 16).sum())}, ≥ 80: {int((ranks >= 80).sum())}, mean log2(1 + rank) "
              f"{float(torch.log2(1 + ranks.float()).mean()):.3f}", flush=True)


print(f"# python position1_table.py {layer} {sys.argv[2]} (SmolLM2, full calibration, first token {first})")
measure(cached, "position 0")
for kind, name in (("p1", "position 1"), ("both", "positions 0 and 1")):
    fit.position0_tables = feature(kind)
    t = time.perf_counter()
    cal = fit.calibrate(LayerTap(lm, layer), LearnedConfig())
    print(f"{name}: calibration {time.perf_counter() - t:.0f} s (screen rank {cal.p_basis.shape[1]}, gain {cal.gain:.2f})",
          flush=True)
    measure(LinearRanker(cal, tap), name)
