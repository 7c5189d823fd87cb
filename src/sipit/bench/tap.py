"""Benchmark: running only the blocks ≤ ℓ makes `extend` cheaper.

Prints JSON with the median time of `LayerTap.extend` (a batch of candidates on a cached prefix)
at layer L/2 and at layer L, measured in the same run, and their ratio (ideal ≈ 0.5).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from . import print_result
from ..models import LayerTap, load_model


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(model: str = "smollm2", prefix_len: int = 20, candidates: int = 256, repeats: int = 7,
        threads: int = 2, seed: int = 0) -> dict:
    torch.set_num_threads(threads)
    lm = load_model(model)
    g = torch.Generator().manual_seed(seed)
    prefix_ids = torch.randint(0, lm.vocab_size, (prefix_len,), generator=g)
    cand = torch.randint(0, lm.vocab_size, (candidates,), generator=g)
    result = dict(bench="tap", model=model, threads=threads, prefix_len=prefix_len,
                  candidates=candidates, repeats=repeats)
    for name, layer in (("half", lm.n_layers // 2), ("full", lm.n_layers)):
        tap = LayerTap(lm, layer)
        prefix = tap.prefill(prefix_ids)
        result[f"layer_{name}"] = layer
        result[f"seconds_{name}"] = _median_seconds(lambda: tap.extend(prefix, cand), repeats)
    result["ratio_half_over_full"] = result["seconds_half"] / result["seconds_full"]
    return result


def main(argv=None):
    p = argparse.ArgumentParser(prog="sipit bench tap", description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prefix-len", type=int, default=20)
    p.add_argument("--candidates", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    print_result(lambda: run(a.model, a.prefix_len, a.candidates, a.repeats, a.threads), "sipit bench tap", argv, indent=2)


if __name__ == "__main__":
    main()
