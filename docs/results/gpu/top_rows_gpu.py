"""top_rows (the ranker's two-stage top-k, written for a CPU) against torch.topk on a GPU: random rows of
Llama-3.1's vocabulary length (128,256), float32 and bfloat16, the shapes the learned policy makes (a guess's
screen, a lock-step block's, a search batch's ranking, a GPU's wide blocks); medians of 50 synchronised calls in
milliseconds. Whether top_rows should leave CUDA to torch.topk.

    python docs/results/gpu/top_rows_gpu.py [OUT.json]"""
import json
import sys
import time

import torch

from sipit.invert.learned import ranker

dev = "cuda"


def ms(f, n: int = 50) -> float:
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2] * 1e3


rows_out = []
for rows, k in ((19, 16), (128, 16), (128, 64), (1, 256), (1024, 16), (4096, 64)):
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, 128_256, device=dev).to(dtype)
        assert torch.equal(x.gather(1, ranker.top_rows(x, k)), x.topk(k, dim=1).values)
        r = dict(rows=rows, k=k, dtype=str(dtype)[6:], topk_ms=ms(lambda: x.topk(k, dim=1).indices),
                 top_rows_ms=ms(lambda: ranker.top_rows(x, k)))
        rows_out.append(r)
        print(f"[{rows}, 128256] {r['dtype']:8s} k = {k}: torch.topk {r['topk_ms']:.3f} ms, top_rows {r['top_rows_ms']:.3f} ms")
if len(sys.argv) > 1:
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows_out), open(sys.argv[1], "w"),
              indent=1)
