"""Wrong first guesses (positions 1-19 of the bench prompts, by source) of a calibration's ranker with its screen at
each rank given, the rest of the calibration as cached: what a screen's rank changes in use, on prompts its fit
never saw (screen_rank_ties.py shows what the fit judged on its validation rows).
    python screen_rank_guesses.py LAYER MODE RANKS SEEDS      e.g. 15 fast 32,256 991,997,1009"""
import sys

from common import bench_prompts, ranker_at, smollm2, with_screen_rank

from sipit.invert.learned.fit import _principal_basis

layer, mode = int(sys.argv[1]), sys.argv[2]
ranks, seeds = [int(x) for x in sys.argv[3].split(",")], [int(x) for x in sys.argv[4].split(",")]
lm = smollm2()
tap, ranker = ranker_at(lm, layer, mode)
print(f"{lm.name} L{layer} {mode}: kept rank {ranker.cal.p_basis.shape[1]}")
basis = _principal_basis(ranker.cal.P, ranker.cal.P.shape[1]).float()
tests = {s: bench_prompts(lm, tap, s) for s in seeds}
for rank in ranks:
    with_screen_rank(ranker, basis, rank)
    for s, (data, ids, states) in tests.items():
        wrong = [int((g != p[1:]).sum()) for (g, _), p in zip(ranker.guesses(states), ids)]
        by_source = {}
        for (source, _), w in zip(data, wrong):
            by_source[source] = by_source.get(source, 0) + w
        print(f"rank {rank:4d} seed {s}: wrong {sum(wrong)} of {sum(len(p) - 1 for p in ids)} {by_source}")
