"""Benchmark of the exact pairwise engine against a plain float32 GEMM of the same size.

    python -m sipit.bench.pairwise --n 20000 --threads 2
    sipit bench pairwise --device cuda --n 200000 --d 4096   # on a GPU: ratio = engine / plain GEMM

Flops counted: the engine is credited with 2*d useful flops per pair i<j (n(n-1)/2 pairs); the
plain GEMM baseline runs x_I @ x_J.T over the engine's own tiles into a reused buffer (nothing
else) and is credited with all 2*|I|*|J|*d flops it computes, including the lower triangles of
the first tile of each row panel. ratio = engine GFLOP/s / GEMM GFLOP/s.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from sipit.bench import parse_config, print_result, sync
from sipit.collisions.pairwise import fp32_highest, min_pairwise, tile_grid

TAKES_DEVICE = True  # `sipit bench pairwise --device cuda` passes the device on


@dataclass
class Config:
    n: int = 20000  # rows
    d: int = 576  # their dimension (SmolLM2's)
    threads: int = 2
    seed: int = 0
    repeats: int = 3
    device: str = "cpu"  # where the rows live: the engine and the GEMM baseline run there


def _gemm_tiles(x: torch.Tensor, block: int) -> int:
    """Plain x @ x.T over the engine's tiles, on x's device; returns the flops computed."""
    width, tiles = tile_grid(len(x), block)
    buf, flops = torch.empty(block * width, device=x.device), 0
    with fp32_highest():  # the same arithmetic as the engine's screen (no TF32)
        for i0, j0 in tiles:
            a, b = x[i0 : i0 + block], x[j0 : j0 + width]
            torch.mm(a, b.T, out=buf[: len(a) * len(b)].view(len(a), len(b)))
            flops += 2 * len(a) * len(b) * x.shape[1]
    return flops


def run(cfg: Config) -> dict:
    """Median timings of min_pairwise and of the plain GEMM on hidden-state-like rows [n, d]."""
    torch.set_num_threads(cfg.threads)
    n, d, dev = cfg.n, cfg.d, torch.device(cfg.device)
    g = torch.Generator().manual_seed(cfg.seed)
    offset = torch.randn(d, generator=g)
    x = 380 * offset / offset.norm() + torch.randn(n, d, generator=g) * (120 / d**0.5)  # norms ~400
    x = x.to(dev)
    engine, gemm = [], []
    for _ in range(cfg.repeats):  # interleaved, so background load hits both alike
        result = min_pairwise(x)
        engine.append(result.seconds)
        sync(dev)
        t = time.perf_counter()
        gemm_flops = _gemm_tiles(x, result.block)
        sync(dev)
        gemm.append(time.perf_counter() - t)
    n_pairs = n * (n - 1) // 2
    t_engine, t_gemm = statistics.median(engine), statistics.median(gemm)
    engine_gflops, gemm_gflops = 2 * n_pairs * d / t_engine / 1e9, gemm_flops / t_gemm / 1e9
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {
        "device": name, "threads": cfg.threads, "n": n, "d": d, "n_pairs": n_pairs, "block": result.block,
        "repeats": cfg.repeats, "engine_seconds": t_engine, "pairs_per_second": n_pairs / t_engine,
        "engine_gflops": engine_gflops, "gemm_seconds": t_gemm, "gemm_gflops": gemm_gflops,
        "ratio": engine_gflops / gemm_gflops, "candidates": result.candidates, "min_distance": result.min_distance,
        "torch": torch.__version__,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(Config, argv, "sipit bench pairwise", __doc__.split("\n")[0])
    print_result(lambda: run(cfg), "sipit bench pairwise", argv)

if __name__ == "__main__":
    main()
