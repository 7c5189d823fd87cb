"""top_rows against torch.topk on random rows of the vocabulary's length (SmolLM2's 49,152): a one-prompt guess's
screen (19 rows, its 16 best), a lock-step block's (128 rows), a lens screen's 64 best, position 0's 64 nearest;
float32 and bfloat16, medians of 60 calls in milliseconds, 2 threads.

    python top_rows_cost.py"""
import time

import torch

from sipit.invert.learned.ranker import top_rows

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


for rows, k in ((19, 16), (128, 16), (128, 64), (1, 64)):
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, 49_152).to(dtype)
        assert torch.equal(x.gather(1, top_rows(x, k)), x.topk(k, dim=1).values)
        print(f"[{rows}, 49152] {str(dtype)[6:]:8s} k = {k}: torch.topk {ms(lambda: x.topk(k, dim=1).indices):.3f} ms, "
              f"top_rows {ms(lambda: top_rows(x, k)):.3f} ms")
