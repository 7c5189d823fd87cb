"""Enumerate every prompt (Theorem 2.2 on a tiny model): every prompt of length 1..K, its
last-token state at each layer, and the exact global minimum distance over all pairs."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from torch import Tensor

from sipit.collisions.pairwise import min_pairwise
from .models import LabError, LabModel, PromptSet, build, check_size, last_token_states


@dataclass
class LayerResult:
    """Collisions among the last-token states of all prompts at one layer."""

    layer: int
    n_prompts: int
    n_pairs: int  # all of them: n(n-1)/2
    min_distance: float  # exact global minimum over all pairs
    min_relative: float  # min_distance / mean state norm
    mean_norm: float
    closest: list  # [(ids, ids, distance)] the closest pairs, closest first
    threshold: float  # a pair collides when its distance <= threshold (= tol * mean norm)
    collisions: int  # number of colliding pairs
    colliding: list  # [(ids, ids, distance)] a few colliding pairs, spread over the closest 1000
    seconds: float
    histogram: dict = field(default_factory=dict, repr=False)


def layer_collisions(states: Tensor, prompts: PromptSet, layers: list[int], *, tol: float = 1e-6,
                     show: int = 5, transform: Callable[[Tensor], Tensor] | None = None) -> list[LayerResult]:
    """One LayerResult per layer from states [len(layers), N, d] (as `last_token_states` returns).

    A pair collides when its distance is <= tol * (mean state norm at that layer). States equal in
    exact arithmetic come out ~1e-8..1e-7 apart in float32 here (every counterexample's predicted
    count is reproduced exactly at tol 1e-6 and 1e-5), so the default 1e-6 sits 10x above rounding.
    `transform` maps the states [N, d] before the check (e.g. a low-precision cast)."""
    out = []
    for layer, x in zip(layers, states):
        if transform is not None:
            x = transform(x)
        threshold = tol * float(x.double().norm(dim=1).mean())
        r = min_pairwise(x, threshold=threshold, keep=max(show, 1), max_below=1000)

        def named(pairs):  # `show` pairs spread over the (sorted) list, to show the variety
            return [(prompts[i], prompts[j], d) for i, j, d in pairs[:: max(1, len(pairs) // max(show, 1))][:show]]

        out.append(LayerResult(
            layer=layer, n_prompts=r.n, n_pairs=r.n_pairs, min_distance=r.min_distance,
            min_relative=r.relative(r.min_distance), mean_norm=r.mean_norm, closest=named(r.closest[:show]),
            threshold=threshold, collisions=r.below_threshold, colliding=named(r.below_pairs),
            seconds=r.seconds, histogram=r.histogram))
    return out


@dataclass
class EnumerationConfig:
    model: LabModel = field(default_factory=LabModel)
    layers: list[int] | None = None  # default: every block output 1..L (0 = embeddings)
    tol: float = 1e-6  # relative collision threshold (see layer_collisions)
    max_prompts: int = 300_000  # refuse larger enumerations
    show: int = 5  # closest / colliding pairs kept per layer


@dataclass
class EnumerationResult:
    config: dict
    n_prompts: int
    n_pairs: int
    layers: list[LayerResult]
    seconds_forward: float
    seconds: float

    @property
    def collisions(self) -> int:
        return sum(r.collisions for r in self.layers)

    def to_dict(self) -> dict:
        return {**asdict(self), "collisions": self.collisions}


def default_layers(cfg: LabModel, layers: list[int] | None) -> list[int]:
    layers = list(range(1, cfg.depth + 1)) if layers is None else layers
    bad = [ell for ell in layers if not 0 <= ell <= cfg.depth]
    if bad:
        raise LabError(f"layers {bad} out of range: the model has layers 0..{cfg.depth} (0 = embeddings)")
    return layers


def run_enumeration(cfg: EnumerationConfig, out_dir=None) -> EnumerationResult:
    """Enumerate all prompts, find the closest pair at every layer; write results to out_dir."""
    t0 = time.perf_counter()
    layers = default_layers(cfg.model, cfg.layers)
    prompts = PromptSet(cfg.model.vocab, cfg.model.context)
    check_size(prompts, cfg.model.width, len(layers), cfg.max_prompts)
    lm = build(cfg.model)
    states = last_token_states(lm, prompts, layers, bos=cfg.model.bos_id)
    t_fwd = time.perf_counter() - t0
    per_layer = layer_collisions(states, prompts, layers, tol=cfg.tol, show=cfg.show)
    n = len(prompts)
    result = EnumerationResult(config=asdict(cfg), n_prompts=n, n_pairs=n * (n - 1) // 2, layers=per_layer,
                              seconds_forward=t_fwd, seconds=time.perf_counter() - t0)
    if out_dir is not None:
        from .report import write_enumeration

        write_enumeration(result, cfg, out_dir)
    return result
