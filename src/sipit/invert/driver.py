"""One driver for every inversion method: load -> tap -> validate prompts -> ε -> engine -> loop.

Every method implements the `Inverter` protocol (`invert_prompt(target, true_ids=None) ->
PromptResult`); `make_inverter` is the one dispatch by method name (CLI, reproduce, benchmarks).

    result = invert(lm, states, layer=15)            # states [T, d], [B, T, d] or a list of [T_i, d]
    result.prompts[0].ids, result.prompts[0].status  # recovered ids, "ok" | "ambiguous" | "failed"
    result = run("hardprompts", lm, states, layer=15, config=HardPromptsConfig(steps=500))
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

import torch
from torch import Tensor

from ..models import LM, LayerTap, load_model
from .config import InversionError, InvertConfig, batch_size_for
from .eps import tolerance_for
from .result import InversionResult, PromptResult

METHODS = ("sipit", "learned", "gradient", "random", "exhaustive", "bruteforce", "hardprompts")


class Inverter(Protocol):
    name: str
    calibration_seconds: float

    def invert_prompt(self, target: Tensor, true_ids: list[int] | None = None) -> PromptResult: ...


def as_prompts(states, dim: int) -> list[Tensor]:
    """[T, d], [B, T, d] or a list of [T_i, d] -> list of [T_i, d]; raises InversionError.

    The one validation of observed states (shape, size = the tap's `dim`, dtype, emptiness)."""
    if isinstance(states, (list, tuple)):
        prompts = [torch.as_tensor(s) for s in states]
    else:
        states = torch.as_tensor(states)
        if states.dim() not in (2, 3):
            raise InversionError(f"states must be [T, d] or [B, T, d], got shape {tuple(states.shape)}")
        prompts = [states] if states.dim() == 2 else list(states)
    if not prompts:
        raise InversionError("no prompts to invert (empty input)")
    for i, s in enumerate(prompts):
        if s.dim() != 2:
            raise InversionError(f"prompt {i}: states must be [T, d], got shape {tuple(s.shape)}")
        if s.shape[1] != dim:
            raise InversionError(f"prompt {i}: observed vectors have size {s.shape[1]}, the tap observes "
                                 f"size {dim} (wrong model or surface?)")
        if s.shape[0] == 0:
            raise InversionError(f"prompt {i}: no positions (empty input)")
        if not s.is_floating_point():
            raise InversionError(f"prompt {i}: states must be floating point, got {s.dtype}")
    return prompts


def bruteforce_config(seed: int = 0, max_seconds: float | None = None, eps: float | None = None) -> InvertConfig:
    """The engine configured as the paper's BruteForce: random order, one candidate per pass."""
    return InvertConfig(policy="random", batch_size=1, first_batch=1, speculate=False, lookahead_tokens=0,
                        seed=seed, max_seconds=max_seconds, eps=eps, right_padding=False)


def make_inverter(method: str, tap, config, eps: float) -> Inverter:
    """The engine of `method` (METHODS, or a Policy class) for one tap. config: InvertConfig for
    SipIt and its presets, HardPromptsConfig for hardprompts (None: defaults)."""
    from .baselines import HardPrompts, HardPromptsConfig
    from .sipit import SipIt

    if method == "hardprompts":
        return HardPrompts(tap=tap, config=config if isinstance(config, HardPromptsConfig) else None, eps=eps)
    config = config if isinstance(config, InvertConfig) else InvertConfig()
    if method == "bruteforce":
        preset = replace(bruteforce_config(config.seed, config.max_seconds, config.eps), certify=config.certify)
        engine = SipIt(tap=tap, config=preset, eps=eps)
        engine.name = "bruteforce"
        return engine
    if method != "sipit":
        if isinstance(method, str) and method not in METHODS:
            raise InversionError(f"unknown method {method!r}: choose from {', '.join(METHODS)}")
        config = replace(config, policy=method)
    return SipIt(tap=tap, config=config, eps=eps)


def run(method, lm: LM | str, states, layer: int, config=None, *, final_norm: bool = False, progress: bool = True,
        true_ids=None, tap=None, max_seconds: float | None = None) -> InversionResult:
    """Invert every prompt of `states` with `method` -> InversionResult.

    tap: any object with LayerTap's interface (lm, layer, final_norm, states, prefill, extend, dim,
    key); default LayerTap(lm, layer, final_norm). max_seconds: per-prompt cap (overrides config's).
    true_ids (optional, list of id lists) only adds exact-match accounting. Raises InversionError
    for input that cannot be inverted at all; per-prompt failures are reported in the result.
    """
    from tqdm.auto import tqdm

    if tap is None:
        lm = load_model(lm) if isinstance(lm, str) else lm
        tap = LayerTap(lm, lm.layer_index(layer), final_norm=final_norm)
    if config is not None and max_seconds is not None:
        config = replace(config, max_seconds=max_seconds)
    elif max_seconds is not None:
        from .baselines import HardPromptsConfig

        config = HardPromptsConfig(max_seconds=max_seconds) if method == "hardprompts" else \
            InvertConfig(max_seconds=max_seconds)
    prompts = as_prompts(states, tap.dim)
    if true_ids is not None and len(true_ids) != len(prompts):
        raise InversionError(f"{len(true_ids)} ground-truth sequences for {len(prompts)} prompts")
    tol = tolerance_for(tap, {s.dtype for s in prompts}, getattr(config, "eps", None),
                        batch_size_for(config, tap.lm.device), getattr(config, "observation_error", 0.0))
    engine = make_inverter(method, tap, config, tol.eps)
    result = InversionResult(model=tap.lm.name, layer=tap.layer, final_norm=tap.final_norm, policy=engine.name,
                             eps=tol.eps, calibration_seconds=engine.calibration_seconds,
                             vocab_size=tap.lm.vocab_size, tolerance=tol.to_json(), tap=tap.key,
                             certify=getattr(getattr(engine, "config", None), "certify", "none"))
    t0 = time.perf_counter()
    # SipIt inverts batch_prompts prompts at a time in lock-step (one forward pass serves them all; as one
    # finishes the next starts); others one by one
    size = max(1, getattr(config, "batch_prompts", 1)) if hasattr(engine, "invert_prompts") else 1
    ids = true_ids if true_ids is not None else [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc=f"{engine.name} {tap.key}", unit="prompt", disable=not progress)
    failed = 0

    def done(i: int, r: PromptResult) -> None:
        nonlocal failed
        failed += r.status == "failed"
        bar.update(1)
        bar.set_postfix(failed=failed)

    if size > 1:
        result.prompts = engine.invert_prompts(prompts, ids, window=size, done=done)
    else:
        for p, i in zip(prompts, ids):
            result.prompts.append(engine.invert_prompt(p, i))
            done(len(result.prompts) - 1, result.prompts[-1])
    bar.close()
    result.seconds = time.perf_counter() - t0
    return result


def invert(lm: LM | str, states, layer: int, config: InvertConfig | None = None, final_norm: bool = False,
           progress: bool = True, true_ids=None, tap=None) -> InversionResult:
    """Recover the token ids whose states at `layer` are `states` with SipIt (config.policy).

    states: [T, d], [B, T, d] or a list of [T_i, d] (float32/16/bf16), as captured by LayerTap.states
    (or HF hidden_states[layer]; `final_norm=True` for post-final-norm states).
    """
    return run("sipit", lm, states, layer, config or InvertConfig(), final_norm=final_norm, progress=progress,
               true_ids=true_ids, tap=tap)
