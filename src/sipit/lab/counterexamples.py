"""Counterexamples: models that break a hypothesis of the injectivity theorems, the exact colliding
prompt pairs the exhaustive check finds in them, and what a random perturbation of the parameters
does to those collisions (Theorem 2.2: the bad parameters form a measure-zero set)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
from torch import Tensor

from sipit.models import LM, attention_weights, position_table, temporary_edit

from .enumerate import LayerResult, default_layers, layer_collisions
from .models import LabError, LabModel, PromptSet, build, check_size, last_token_states, perturb


@dataclass
class Counterexample:
    name: str
    breaks: str  # the hypothesis that no longer holds
    theorem: str
    expect: str  # which prompts collide, and why
    edit: Callable[[LM], None] | None = None  # weight surgery, in place
    states: Callable[[Tensor], Tensor] | None = None  # applied to the states [N, d] before the check
    model: dict = field(default_factory=dict)  # LabModel fields this counterexample forces
    measure_zero: bool = True  # True if a perturbation of the parameters should remove the collisions


@torch.no_grad()
def duplicate_embedding(lm: LM, a: int = 0, b: int = 1):
    lm.embed.weight[b] = lm.embed.weight[a]


@torch.no_grad()
def uniform_attention_no_positions(lm: LM):
    table = position_table(lm)
    if table is not None:
        table.zero_()
    for block in range(lm.n_layers):
        for w in attention_weights(lm, block)["qk"]:
            w.zero_()


@torch.no_grad()
def zero_attention(lm: LM):
    for block in range(lm.n_layers):
        for w in attention_weights(lm, block)["out"]:
            w.zero_()


@torch.no_grad()
def quantize_weights(lm: LM, grid: float = 6.0):
    """Round every weight matrix (embeddings included; norms and biases kept) to multiples of
    grid × its mean |w|: an extremely coarse per-tensor fixed-point format, in which only the few
    weights beyond grid/2 × mean |w| survive, as ±step (grid 6: ~3% non-zero)."""
    for p in lm.model.parameters():
        if p.dim() >= 2:
            step = grid * p.abs().mean()
            p.copy_(torch.round(p / step) * step)


def cast(dtype: str) -> Callable[[Tensor], Tensor]:
    return lambda x: x.to(getattr(torch, dtype)).float()


def catalogue(quant: str = "float8_e4m3fn", grid: float = 6.0) -> dict[str, Counterexample]:
    items = [
        Counterexample(
            "duplicate-embedding", "parameters drawn from a density: two embedding rows are equal (E[1] = E[0])",
            "2.2", "every prompt collides with the prompts obtained by exchanging tokens 0 and 1",
            edit=duplicate_embedding),
        Counterexample(
            "uniform-attention-no-positions",
            "parameters drawn from a density: position embeddings and all query/key weights are zero, so "
            "attention is a uniform average that cannot see order",
            "2.2", "after block 1, prompts equal up to a permutation of all but the last token; at every "
            "layer, repetitions of one token (a, aa, aaa, ...)",
            edit=uniform_attention_no_positions),
        Counterexample(
            "zero-attention", "parameters drawn from a density: every attention output projection is zero, "
            "so the last state is a function of the last token and its position only",
            "2.2", "prompts of equal length with the same last token (any length on a rotary model)",
            edit=zero_attention),
        Counterexample(
            "quantized-weights", f"parameters drawn from a density: every weight matrix is rounded to a grid "
            f"of {grid:g} × its mean |w|, a lattice point (measure zero) where most weights are exactly 0",
            "2.2", "tokens whose embedding rows round to all zeros become one token; whatever else the "
            "zeros make equal (the exhaustive check finds which)",
            edit=lambda lm: quantize_weights(lm, grid)),
        Counterexample(
            "quantized-states", f"real-analytic map (Theorem 2.1): states are stored as {quant}, "
            "a piecewise-constant function with finitely many values",
            "2.1/2.2", "near neighbours (prompts differing in an early token or by a swap) round to the same value",
            states=cast(quant), measure_zero=False),
        Counterexample(
            "rotary-without-bos", "distinct prompts must give analytically distinct maps: with rotary "
            "positions and no BOS token, a constant prompt a...a has identical keys and values at every "
            "position, so its state equals that of the single token a for *every* parameter value",
            "2.2", "a, aa, aaa, ... for every token a, at every layer",
            model=dict(arch="llama", bos=False), measure_zero=False),
    ]
    return {c.name: c for c in items}


@dataclass
class CounterexampleConfig:
    model: LabModel = field(default_factory=lambda: LabModel(vocab=8, context=4))
    names: list[str] | None = None  # default: all of catalogue()
    layers: list[int] | None = None  # default: every block output
    sigmas: list[float] = field(default_factory=lambda: [1e-5, 1e-4, 1e-3, 1e-2])  # perturbation scales tried
    perturb_seed: int = 1234
    quant: str = "float8_e4m3fn"  # dtype of the quantized-states counterexample
    grid: float = 6.0  # quantized-weights: grid step in units of each matrix's mean |w|
    tol: float = 1e-6
    max_prompts: int = 300_000
    show: int = 3


@dataclass
class CounterexampleOutcome:
    name: str
    breaks: str
    theorem: str
    expect: str
    measure_zero: bool
    model: dict
    before: list[LayerResult]
    after: list[tuple[float, list[LayerResult]]]  # (sigma, per-layer results after perturbation)

    @property
    def found(self) -> int:
        """Colliding pairs before perturbation, summed over layers."""
        return sum(r.collisions for r in self.before)

    @property
    def removed_at(self) -> float | None:
        """Smallest perturbation scale after which no layer has a collision (None: never)."""
        return next((s for s, rs in sorted(self.after) if all(r.collisions == 0 for r in rs)), None)

    def example(self) -> tuple | None:
        """One colliding pair (ids, ids, distance) from the first layer that has one."""
        return next((r.colliding[0] for r in self.before if r.colliding), None)


@dataclass
class CounterexamplesResult:
    config: dict
    n_prompts: int
    items: list[CounterexampleOutcome]
    seconds: float

    def to_dict(self) -> dict:
        d = asdict(self)
        for item, out in zip(self.items, d["items"]):
            out.update(found=item.found, removed_at=item.removed_at)
        return d


def run_one(c: Counterexample, cfg: CounterexampleConfig, prompts: PromptSet) -> CounterexampleOutcome:
    model = replace(cfg.model, **c.model)
    layers = default_layers(model, cfg.layers)

    def check(lm):
        states = last_token_states(lm, prompts, layers, bos=model.bos_id)
        return layer_collisions(states, prompts, layers, tol=cfg.tol, show=cfg.show, transform=c.states)

    lm = build(model)
    if c.edit is not None:
        c.edit(lm)
    before = check(lm)
    after = []
    for sigma in cfg.sigmas:  # each perturbation starts from the counterexample itself
        with temporary_edit(lm):
            after.append((sigma, check(perturb(lm, sigma, seed=cfg.perturb_seed))))
    return CounterexampleOutcome(c.name, c.breaks, c.theorem, c.expect, c.measure_zero, asdict(model), before, after)


def run_counterexamples(cfg: CounterexampleConfig, out_dir=None) -> CounterexamplesResult:
    """Build each counterexample, find its collisions, perturb it; write results to out_dir."""
    t0 = time.perf_counter()
    known = catalogue(cfg.quant, cfg.grid)
    names = cfg.names or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise LabError(f"unknown counterexample(s) {unknown}: choose from {', '.join(known)}")
    if not isinstance(getattr(torch, cfg.quant, None), torch.dtype) or not getattr(torch, cfg.quant).is_floating_point:
        raise LabError(f"--quant {cfg.quant!r} is not a torch float dtype (e.g. float8_e4m3fn, float8_e5m2, bfloat16)")
    if not cfg.grid > 0:
        raise LabError(f"--grid must be a positive multiple of the mean |w|, got {cfg.grid}")
    if not cfg.sigmas or min(cfg.sigmas) <= 0:
        raise LabError(f"perturbation scales must be positive, got {cfg.sigmas}")
    prompts = PromptSet(cfg.model.vocab, cfg.model.context)
    check_size(prompts, cfg.model.width, cfg.model.depth, cfg.max_prompts)
    items = [run_one(known[n], cfg, prompts) for n in names]
    result = CounterexamplesResult(asdict(cfg), len(prompts), items, time.perf_counter() - t0)
    if out_dir is not None:
        from .report import write_counterexamples

        write_counterexamples(result, cfg, out_dir)
    return result
