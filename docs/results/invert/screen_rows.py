"""The guesses of a lock-step batch (32 bench prompts of seed 5, 608 positions) against SCREEN_ROWS, the rows per
screening product: screen_best alone and the whole ranker.guesses, medians of 7, at layers 1 and 15.
    python screen_rows.py"""
from common import bench_prompts, median_ms, ranker_at, smollm2
from sipit.invert.learned import ranker as R
lm = smollm2()
for layer in (1, 15):
    tap, rk = ranker_at(lm, layer)
    _, _, S = bench_prompts(lm, tap, 5, per_source=8)
    r = rk.context_residuals(*S)
    for rows in (16, 32, 64, 128, 256):
        R.SCREEN_ROWS = rows
        print(f"layer {layer} rows {rows}: screen_best of {len(r)} {median_ms(lambda: rk.screen_best(r)):.1f} ms, "
              f"guesses {median_ms(lambda: rk.guesses(S)):.1f} ms", flush=True)
