"""Benchmark: the same sweep tasks on the local engine and on a local Ray, throughput and overhead.

    python -m sipit.bench.engines --workers 2 --threads 2

Measures (interleaved, `repeats` times, medians): Ray start-up; the round trip of an empty task;
state capture (prompts/s: last-token states at every layer, engines.capture tasks); the exact
pairwise search (pairs/s: row-panel tasks). Local runs in this process with `threads` torch
threads; Ray runs `workers` single-threaded workers. On one machine Ray cannot beat local by much
(the same cores); what it shows is its overhead, and the per-worker throughput that the cost model
in docs/results/ray/README.md scales to N workers.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from . import parse_config, print_result
from ..collisions import pairwise
from ..collisions.common import capture_states
from ..engines import LocalEngine, ModelRef, RayEngine
from ..models import load_model


@dataclass
class Config:
    model: str = "smollm2"
    prompts: int = 256  # state capture: random-id prompts of `length` tokens, all layers
    length: int = 20
    batch_size: int = 32
    n: int = 20000  # pairwise: rows of dimension d
    d: int = 576
    panel_pairs: int = 2**24  # pairs per pairwise task (about 12 tasks at n = 20000)
    workers: int = 2
    threads: int = 2
    repeats: int = 3
    seed: int = 0


def _noop(shared, item):
    return item


def run(cfg: Config) -> dict:
    torch.set_num_threads(cfg.threads)
    lm = load_model(cfg.model)
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, lm.vocab_size, (cfg.prompts, cfg.length), generator=g)
    job = dict(model=ModelRef.of(lm), layers=list(range(lm.n_layers + 1)), final_norm=False)
    batches = list(ids.split(cfg.batch_size))
    x = torch.randn(cfg.n, cfg.d, generator=g) * (120 / cfg.d**0.5) + 380 * torch.randn(cfg.d, generator=g) / cfg.d**0.5

    t = time.perf_counter()
    ray_engine = RayEngine(num_cpus=cfg.workers)
    ray_engine.start()
    startup = time.perf_counter() - t
    list(ray_engine.map(_noop, range(cfg.workers * 4)))  # workers up
    t = time.perf_counter()
    list(ray_engine.map(_noop, range(100)))
    task_overhead = (time.perf_counter() - t) / 100

    def capture(engine):
        t = time.perf_counter()
        for _ in engine.map(capture_states, batches, job):
            pass
        return cfg.prompts / (time.perf_counter() - t)

    def search(engine):
        t = time.perf_counter()
        r = pairwise.min_pairwise(x, engine=engine, panel_pairs=cfg.panel_pairs)
        return cfg.n * (cfg.n - 1) / 2 / (time.perf_counter() - t), r.closest

    capture(ray_engine)  # each worker loads the model once, outside the timings
    out = {"local": dict(prompts_per_s=[], pairs_per_s=[]), "ray": dict(prompts_per_s=[], pairs_per_s=[])}
    for _ in range(cfg.repeats):  # interleaved, so background load hits both alike
        for name, engine in (("local", LocalEngine()), ("ray", ray_engine)):
            out[name]["prompts_per_s"].append(capture(engine))
            pairs_per_s, closest = search(engine)
            out[name]["pairs_per_s"].append(pairs_per_s)
            out[name].setdefault("closest", closest)
    assert out["local"].pop("closest") == out["ray"].pop("closest")  # the same exact result
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in out.items()}
    ray_engine.ray.shutdown()
    return dict(bench="engines", model=cfg.model, n_layers=lm.n_layers, config=cfg.__dict__,
                ray_startup_s=startup, ray_task_roundtrip_s=task_overhead, runs=out, median=med,
                ray_over_local=dict(capture=med["ray"]["prompts_per_s"] / med["local"]["prompts_per_s"],
                                    pairwise=med["ray"]["pairs_per_s"] / med["local"]["pairs_per_s"]),
                pairwise_tasks=len(pairwise.panels(cfg.n, cfg.panel_pairs)))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(Config, argv, "python -m sipit.bench.engines", __doc__.split("\n")[0])
    print_result(lambda: run(cfg), "python -m sipit.bench.engines", argv)


if __name__ == "__main__":
    main()
