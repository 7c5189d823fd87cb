"""SipIt's guarantee on a tiny model (Theorem 3.1): every prompt of length <= K is recovered from its
states at a layer, and never after more than T·|V| candidate evaluations."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import Tensor

from sipit.invert import InvertConfig, invert
from sipit.models import LM, run_layers

from .enumerate import default_layers
from .models import LabError, LabModel, PromptSet, build, check_size, with_bos


@dataclass
class Inverted:
    """What an inverter returns for a batch of B prompts of length T."""

    ids: Tensor  # [B, T] recovered tokens
    steps: Tensor  # [B] candidate evaluations a sequential SipIt would have made
    accepted: Tensor  # [B] bool: every position had a candidate within ε
    min_wrong: float = float("inf")  # smallest relative distance of a rejected candidate seen


# (lm, layer, states [B, P+T, d] of prefix + prompts, prefix ids [P]) -> Inverted for the T prompt positions
InvertFn = Callable[[LM, int, Tensor, list[int]], Inverted]


def engine(policy: str = "exhaustive", eps: float | None = None) -> InvertFn:
    """The project's SipIt engine (`sipit.invert.invert`) as an InvertFn, prompt by prompt. It
    recovers the prefix too (a BOS is a vocabulary token like any other); the prefix must come
    back unchanged, and the steps counted are the candidates it evaluated at the prompt positions."""
    def fn(lm: LM, layer: int, states: Tensor, prefix: list[int]) -> Inverted:
        P, (B, n, _) = len(prefix), states.shape
        res = invert(lm, states, layer, InvertConfig(policy=policy, eps=eps), progress=False)
        ids = torch.full((B, n - P), -1, dtype=torch.long)
        steps = torch.zeros(B, dtype=torch.long)
        accepted = torch.zeros(B, dtype=torch.bool)
        min_wrong = float("inf")
        for b, p in enumerate(res.prompts):
            got = p.ids + [-1] * (n - len(p.ids))
            ids[b] = torch.tensor(got[P:])
            steps[b] = sum(q.tried for q in p.positions[P:])
            accepted[b] = p.status == "ok" and got[:P] == list(prefix)
            min_wrong = min([min_wrong] + [q.margin for q in p.positions[P:] if q.margin is not None])
        return Inverted(ids, steps, accepted, min_wrong)

    fn.__name__ = f"sipit.invert.invert(policy={policy!r})"
    return fn


@dataclass
class GuaranteeConfig:
    model: LabModel = field(default_factory=lambda: LabModel(vocab=8, context=4))
    layers: list[int] | None = None  # default: every block output
    eps: float = 1e-5  # acceptance radius relative to ‖h_t‖
    max_prompts: int = 300_000


@dataclass
class LayerGuarantee:
    layer: int
    n_prompts: int
    recovered: int  # prompts recovered exactly
    accepted: int  # prompts where every position had a candidate within ε
    max_steps: int  # over all prompts
    max_steps_ratio: float  # max over prompts of steps / (T·|V|): ≤ 1 is the guarantee
    mean_steps: float
    min_wrong_relative: float  # closest rejected candidate, relative to ‖h_t‖: the margin over ε
    failures: list  # [(true ids, recovered ids)] first few
    by_length: list  # [{length, n, recovered, max_steps, mean_steps, bound}] per prompt length T
    seconds: float


@dataclass
class GuaranteeResult:
    config: dict
    inverter: str
    n_prompts: int
    vocab: int  # |V|: the model's vocabulary (with the BOS row if any), all of it searched
    max_len: int
    bound: int  # K·|V|: the largest T·|V|
    layers: list[LayerGuarantee]
    seconds: float

    @property
    def holds(self) -> bool:
        return all(r.recovered == r.n_prompts and r.max_steps_ratio <= 1 for r in self.layers)

    def to_dict(self) -> dict:
        return {**asdict(self), "holds": self.holds}


def check_layer(lm: LM, prompts: PromptSet, layer: int, invert_fn: InvertFn, bos: int | None = None,
                show: int = 5) -> LayerGuarantee:
    """Invert every prompt from its own full-forward states at `layer`; count exact recoveries."""
    t0 = time.perf_counter()
    accepted, min_wrong, failures = 0, float("inf"), []
    prefix = [] if bos is None else [bos]
    by_length = []
    for T in range(1, prompts.max_len + 1):
        true = prompts.of_length(T)  # [V^T, T]
        row = dict(length=T, n=len(true), recovered=0, max_steps=0, mean_steps=0.0, bound=T * lm.vocab_size)
        for s in range(0, len(true), 4096):
            ids = true[s : s + 4096]
            with torch.no_grad():
                states = run_layers(lm, [layer], ids=with_bos(ids, bos))[0]  # [B, P+T, d]
            out = invert_fn(lm, layer, states, prefix)
            good = (out.ids == ids).all(1)
            row["recovered"] += int(good.sum())
            row["max_steps"] = max(row["max_steps"], int(out.steps.max()))
            row["mean_steps"] += float(out.steps.sum()) / len(true)
            accepted += int(out.accepted.sum())
            min_wrong = min(min_wrong, out.min_wrong)
            bad = (~good).nonzero()[:, 0][: show - len(failures)]
            failures += [(ids[i].tolist(), out.ids[i].tolist()) for i in bad]
        by_length.append(row)
    n = sum(r["n"] for r in by_length)
    return LayerGuarantee(
        layer, n, sum(r["recovered"] for r in by_length), accepted, max(r["max_steps"] for r in by_length),
        max(r["max_steps"] / r["bound"] for r in by_length), sum(r["mean_steps"] * r["n"] for r in by_length) / n,
        min_wrong, failures, by_length, time.perf_counter() - t0)


def run_guarantee(cfg: GuaranteeConfig, out_dir=None, invert_fn: InvertFn | None = None) -> GuaranteeResult:
    """Invert all prompts of length 1..K at each layer; write results to out_dir.

    invert_fn: any inverter with the InvertFn signature; default: the SipIt engine, exhaustive policy."""
    t0 = time.perf_counter()
    layers = default_layers(cfg.model, cfg.layers)
    prompts = PromptSet(cfg.model.vocab, cfg.model.context)
    check_size(prompts, cfg.model.width, 1, cfg.max_prompts)
    lm = build(cfg.model)
    fn = invert_fn or engine("exhaustive", cfg.eps)
    name = getattr(fn, "__name__", repr(fn))
    per_layer = [check_layer(lm, prompts, layer, fn, cfg.model.bos_id) for layer in layers]
    result = GuaranteeResult(asdict(cfg), name, len(prompts), lm.vocab_size, prompts.max_len,
                             prompts.max_len * lm.vocab_size, per_layer, time.perf_counter() - t0)
    if out_dir is not None:
        from .report import write_guarantee

        write_guarantee(result, cfg, out_dir)
    return result
