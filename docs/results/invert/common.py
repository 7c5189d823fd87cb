"""What the measurement scripts of this folder share (those since 692fd15): SmolLM2's learned ranker at a layer
(full calibration, cached), and the bench prompts of a seed with their states. 2 threads, as every number here."""
import statistics
import time

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
SOURCES = ["prose", "code", "random", "chat"]


def smollm2():
    return load_model("smollm2")


def ranker_at(lm, layer: int):
    """(the tap at layer, its LinearRanker from the full calibration)."""
    engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=1e-4)
    return LayerTap(lm, layer), engine.policy.ranker


def bench_prompts(lm, tap, seed: int, per_source: int = 10):
    """The bench's prompts of a seed (per_source of each SOURCE, 20 tokens): ([(source, ids)], ids [n, 20],
    float32 states at the tap, a list of [20, d])."""
    data = prompts(lm, SOURCES, per_source, 20, seed)
    ids = torch.tensor([p for _, p in data])
    return data, ids, [s.float() for s in tap.states(ids)]


def median_ms(f, repeats: int = 7) -> float:
    """Median milliseconds of f() over repeats calls."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3
