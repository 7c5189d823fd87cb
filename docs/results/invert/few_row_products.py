"""Few-row products on this CPU: torch's F.linear (x Wᵀ), x @ Wᵀ made contiguous, (W xᵀ)ᵀ and MKL's packed linear, for
SmolLM2's three weight shapes (24 copies each, so that they do not stay in cache), n rows; microseconds a product
(medians of 41) and the largest difference from F.linear. The output is in few_row_products.txt.

    python few_row_products.py"""
import time, torch, torch.nn.functional as F
torch.set_num_threads(2)

def med(f, n=41):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[n // 2] * 1e6
# many weights so they do not stay in cache: 15 layers' worth of one shape
for (o, i) in ((1536, 576), (576, 1536), (576, 576)):
    Ws = [torch.randn(o, i) / i ** .5 for _ in range(24)]
    Wts = [w.t().contiguous() for w in Ws]
    try:
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, 16) for w in Ws]
    except Exception as e:
        packed = None; print("no mkl pack", e)
    for n in (1, 2, 3, 4, 8, 16, 32):
        x = torch.randn(n, i)
        a = med(lambda: [F.linear(x, w) for w in Ws]) / 24
        b = med(lambda: [x @ w for w in Wts]) / 24
        c = med(lambda: [(w @ x.T).T for w in Ws]) / 24
        ref = F.linear(x, Ws[0])
        d_b = (x @ Wts[0] - ref).abs().max().item(); d_c = ((Ws[0] @ x.T).T - ref).abs().max().item()
        s = f"[{o}x{i}] n={n:2d}: linear {a:6.1f} us, x@Wt {b:6.1f} ({d_b:.1e}), (Wx^T)^T {c:6.1f} ({d_c:.1e})"
        if packed:
            try:
                e = med(lambda: [torch.ops.mkl._mkl_linear(x, p, w, None, 16) for p, w in zip(packed, Ws)]) / 24
                d_e = (torch.ops.mkl._mkl_linear(x, packed[0], Ws[0], None, 16) - ref).abs().max().item()
                s += f", mkl packed {e:6.1f} ({d_e:.1e})"
            except Exception as ex:
                s += f" packed err {ex}"[:80]
        print(s, flush=True)
