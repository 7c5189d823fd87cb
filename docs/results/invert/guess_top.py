"""Wrong first guesses (ranker.guesses) and their time per prompt (all 40 one at a time, median of 3) when the
guesses rescore the screen's best m exactly (LearnedConfig.guess_top), on the bench prompts of each seed.
    python guess_top.py LAYER SEEDS MS        e.g. 15 59,61,67 4,16,64"""
import sys
from common import bench_prompts, median_ms, ranker_at, smollm2
layer = int(sys.argv[1]); lm = smollm2(); tap, rk = ranker_at(lm, layer)
for seed in [int(s) for s in sys.argv[2].split(",")]:
    data, tids, states = bench_prompts(lm, tap, seed)
    for m in [int(x) for x in sys.argv[3].split(",")]:
        rk.guess_top = m
        w = [int((g != p[1:]).sum()) for (g, _), p in zip(rk.guesses(states), tids)]
        ms = median_ms(lambda: [rk.guesses([s]) for s in states], 3) / len(states)
        print(f"layer {layer} seed {seed} m {m}: wrong {sum(w)} of {19 * len(w)}, prompts with none "
              f"{sum(x == 0 for x in w)}/{len(w)}, {ms:.2f} ms a prompt", flush=True)
