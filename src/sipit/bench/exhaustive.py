"""Benchmark: the two costs of the exhaustive (append-every-token) collision test for one prefix.

Prints JSON with states/s (candidates appended to a cached prefix, all requested layers in one pass)
and pairs/s (the exact pairwise search on those states), and the projected time of a full
vocabulary sweep: V / states_per_s + layers * V(V-1)/2 / pairs_per_s. `--candidates 0` = all V.
pairs/s grows with the number of rows (fixed costs amortise), so the projection is pessimistic.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from . import parse_config, print_result
from ..collisions.common import parse_layers
from ..collisions.pairwise import min_pairwise
from ..models import LayerTap, load_model

TAKES_DEVICE = True  # `sipit bench exhaustive --device cuda` passes the device on


@dataclass
class Config:
    model: str = "smollm2"
    prefix_len: int = 20
    candidates: int = 8192  # 0 = the whole vocabulary
    batch_size: int = 512
    layers: str = "1,-1"
    threads: int = 2
    seed: int = 0
    device: str = "cpu"


def run(cfg: Config) -> dict:
    torch.set_num_threads(cfg.threads)
    lm = load_model(cfg.model, device=cfg.device)
    layers = parse_layers(cfg.layers, lm)
    V = lm.vocab_size
    n = min(cfg.candidates or V, V)
    g = torch.Generator().manual_seed(cfg.seed)
    prefix_ids = torch.randint(0, V, (cfg.prefix_len,), generator=g).to(lm.device)
    cand = torch.randperm(V, generator=g)[:n].to(lm.device)
    tap = LayerTap(lm, max(layers))
    prefix = tap.prefill(prefix_ids)
    tap.extend_layers(prefix, cand[:8], layers)  # warm-up
    t = time.perf_counter()
    states = [torch.cat(hs) for hs in zip(*(tap.extend_layers(prefix, cand[s:s + cfg.batch_size], layers)
                                            for s in range(0, n, cfg.batch_size)))]
    t_states = time.perf_counter() - t
    t = time.perf_counter()
    minima = [min_pairwise(x).min_distance for x in states]
    t_pairs = time.perf_counter() - t
    states_per_s = n / t_states
    pairs_per_s = len(layers) * n * (n - 1) / 2 / t_pairs
    full = V / states_per_s + len(layers) * V * (V - 1) / 2 / pairs_per_s
    return dict(bench="exhaustive", model=cfg.model, device=str(lm.device), threads=cfg.threads,
                prefix_len=cfg.prefix_len, candidates=n, batch_size=cfg.batch_size, layers=layers,
                states_per_s=states_per_s, pairs_per_s=pairs_per_s, min_distance=dict(zip(layers, minima)),
                projected_full_vocab_seconds=full)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(Config, argv, "sipit bench exhaustive", __doc__)
    print_result(lambda: run(cfg), "sipit bench exhaustive", argv)

if __name__ == "__main__":
    main()
