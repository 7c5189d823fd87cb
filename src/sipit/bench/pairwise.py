"""Benchmark of the exact pairwise engine against a plain float32 GEMM of the same size.

    python -m sipit.bench.pairwise --n 20000 --threads 2

Flops counted: the engine is credited with 2*d useful flops per pair i<j (n(n-1)/2 pairs); the
plain GEMM baseline runs x_I @ x_J.T over the engine's own tiles into a reused buffer (nothing
else) and is credited with all 2*|I|*|J|*d flops it computes, including the lower triangles of
the first tile of each row panel. ratio = engine GFLOP/s / GEMM GFLOP/s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sipit.collisions.pairwise import min_pairwise, tile_grid


def _gemm_tiles(x: torch.Tensor, block: int) -> int:
    """Plain x @ x.T over the engine's tiles; returns the flops computed."""
    width, tiles = tile_grid(len(x), block)
    buf, flops = torch.empty(block * width), 0
    for i0, j0 in tiles:
        a, b = x[i0 : i0 + block], x[j0 : j0 + width]
        torch.mm(a, b.T, out=buf[: len(a) * len(b)].view(len(a), len(b)))
        flops += 2 * len(a) * len(b) * x.shape[1]
    return flops


def run(n: int = 20000, d: int = 576, threads: int = 2, seed: int = 0, repeats: int = 3) -> dict:
    """Median timings of min_pairwise and of the plain GEMM on hidden-state-like rows [n, d]."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    offset = torch.randn(d, generator=g)
    x = 380 * offset / offset.norm() + torch.randn(n, d, generator=g) * (120 / d**0.5)  # norms ~400
    engine, gemm = [], []
    for _ in range(repeats):  # interleaved, so background load hits both alike
        result = min_pairwise(x)
        engine.append(result.seconds)
        t = time.perf_counter()
        gemm_flops = _gemm_tiles(x, result.block)
        gemm.append(time.perf_counter() - t)
    n_pairs = n * (n - 1) // 2
    t_engine, t_gemm = statistics.median(engine), statistics.median(gemm)
    engine_gflops, gemm_gflops = 2 * n_pairs * d / t_engine / 1e9, gemm_flops / t_gemm / 1e9
    return {
        "threads": threads, "n": n, "d": d, "n_pairs": n_pairs, "block": result.block, "repeats": repeats,
        "engine_seconds": t_engine, "pairs_per_second": n_pairs / t_engine, "engine_gflops": engine_gflops,
        "gemm_seconds": t_gemm, "gemm_gflops": gemm_gflops, "ratio": engine_gflops / gemm_gflops,
        "candidates": result.candidates, "min_distance": result.min_distance, "torch": torch.__version__,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="sipit bench pairwise", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--d", type=int, default=576)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(json.dumps(run(args.n, args.d, args.threads, args.seed, args.repeats), indent=1))


if __name__ == "__main__":
    main()
