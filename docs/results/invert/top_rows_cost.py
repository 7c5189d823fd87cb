"""top_rows against torch.topk on random rows of the vocabulary's length (SmolLM2's 49,152): a one-prompt guess's
screen (19 rows, its 16 best), a lock-step block's (128 rows), a lens screen's 64 best, position 0's 64 nearest, a
search batch's 256; float32 and bfloat16, with groups of 16 (TOP_GROUP) and 64 columns, medians of 60 calls in
milliseconds, 2 threads.

    python top_rows_cost.py"""
import time

import torch

from sipit.invert.learned import ranker

torch.set_num_threads(2)


def ms(f, n: int = 60) -> float:
    for _ in range(3):
        f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2] * 1e3


for rows, k in ((19, 16), (128, 16), (128, 64), (1, 64), (1, 256)):
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, 49_152).to(dtype)
        line = f"[{rows}, 49152] {str(dtype)[6:]:8s} k = {k}: torch.topk {ms(lambda: x.topk(k, dim=1).indices):.3f} ms"
        for group in (16, 64):
            ranker.TOP_GROUP = group
            assert torch.equal(x.gather(1, ranker.top_rows(x, k)), x.topk(k, dim=1).values)
            line += f", top_rows (groups of {group}) {ms(lambda: ranker.top_rows(x, k)):.3f} ms"
        print(line)
