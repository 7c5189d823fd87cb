"""Benchmark: the two costs of the exhaustive collision test for one prefix.

Prints JSON with states/s (candidates appended to a cached prefix, all requested layers in one pass)
and pairs/s (the exact pairwise search on those states), and the projected time of a full
vocabulary sweep: V / states_per_s + layers * V(V-1)/2 / pairs_per_s. `--candidates 0` = all V.
pairs/s grows with the number of rows (fixed costs amortise), so the projection is pessimistic.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from ..collisions.pairwise import min_pairwise
from ..models import LayerTap, load_model


def run(model: str = "smollm2", prefix_len: int = 20, candidates: int = 8192, batch_size: int = 512,
        layers: tuple[int, ...] = (1, -1), threads: int = 2, seed: int = 0) -> dict:
    torch.set_num_threads(threads)
    lm = load_model(model)
    layers = [lm.layer_index(layer) for layer in layers]
    V = lm.vocab_size
    n = min(candidates or V, V)
    g = torch.Generator().manual_seed(seed)
    prefix_ids = torch.randint(0, V, (prefix_len,), generator=g)
    cand = torch.randperm(V, generator=g)[:n]
    tap = LayerTap(lm, max(layers))
    prefix = tap.prefill(prefix_ids)
    tap.extend_layers(prefix, cand[:8], layers)  # warm-up
    t = time.perf_counter()
    states = [torch.cat(hs) for hs in zip(*(tap.extend_layers(prefix, cand[s:s + batch_size], layers)
                                            for s in range(0, n, batch_size)))]
    t_states = time.perf_counter() - t
    t = time.perf_counter()
    minima = [min_pairwise(x).min_distance for x in states]
    t_pairs = time.perf_counter() - t
    states_per_s = n / t_states
    pairs_per_s = len(layers) * n * (n - 1) / 2 / t_pairs
    full = V / states_per_s + len(layers) * V * (V - 1) / 2 / pairs_per_s
    return dict(bench="exhaustive", model=model, threads=threads, load=[round(x, 2) for x in os.getloadavg()],
                prefix_len=prefix_len, candidates=n, batch_size=batch_size, layers=layers,
                states_per_s=states_per_s, pairs_per_s=pairs_per_s, min_distance=dict(zip(layers, minima)),
                projected_full_vocab_seconds=full)


def main(argv=None):
    p = argparse.ArgumentParser(prog="sipit bench exhaustive", description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prefix-len", type=int, default=20)
    p.add_argument("--candidates", type=int, default=8192, help="0 = the whole vocabulary")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--layers", default="1,-1")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    layers = tuple(int(x) for x in a.layers.split(","))
    print(json.dumps(run(a.model, a.prefix_len, a.candidates, a.batch_size, layers, a.threads), indent=2))


if __name__ == "__main__":
    main()
