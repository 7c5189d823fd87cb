"""Settings of the SipIt loop (nested per policy, like nanoGCG's ProbeSamplingConfig) and its input errors."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..io import SipitError

if TYPE_CHECKING:
    from .learned.config import LearnedConfig


class InversionError(SipitError, ValueError):
    """Input that cannot be inverted at all (shape, emptiness); the message says why."""


@dataclass
class GradientConfig:
    """The gradient policy's settings (the paper's policy)."""

    steps: int = 200  # steps before falling back to exhaustive order
    lr: float = 0.1  # Adam step, relative to the mean embedding norm
    snap_every: int = 1  # propose candidates every K steps
    snap_k: int = 8  # nearest unvisited rows proposed per snap


@dataclass
class InvertConfig:
    policy: str = "learned"  # exhaustive | random | gradient | learned (policies.py), or a Policy class
    eps: float | None = None  # relative acceptance threshold; None: measured (eps.py) + observation_error
    observation_error: float = 0.0  # relative error the observations carry beyond recomputation (storage
    #                                 rounding, least squares from logits, added noise): added to measured ε
    certify: str = "none"  # "none" | "top:K" | "full": alternatives evaluated at every position after recovery
    batch_size: int | None = None  # candidates per forward pass when searching a position; None: the
    #                                device's (batch_size_for)
    speculate: bool = True  # verify the policy's guesses of the positions ahead, a row a pass, if it makes any
    lookahead_tokens: int = 32  # first search batch: candidates × (1 + guessed continuation) tokens
    first_batch: int = 16  # then candidate batches of 16, 64, 256, ... up to batch_size
    max_candidates: int | None = None  # per position; None: the whole vocabulary before failing
    max_seconds: float | None = None  # per prompt wall-clock cap; a capped prompt ends "failed" (message says so)
    right_padding: bool = True  # a search with nothing within ε may end the prompt at a right-padded batch's padding
    #                             (SipIt._right_padding: one forward); off for the paper's BruteForce
    # lock-step (sipit.py): prompts inverted together, each on its own clock, and new tokens per shared
    # pass. They change speed, not results: repr=False keeps them out of result keys (invert/cli.py)
    batch_prompts: int = field(default=32, repr=False)
    pass_tokens: int | None = field(default=None, repr=False)  # new tokens a shared pass (a lock-step round's,
    #                                the certificates') takes at most; None: the device's (pass_tokens_for)
    draft: bool = field(default=False, repr=False)  # a search's batches of DRAFT_FROM candidates and more go through
    #                                a bfloat16 copy of a float32 model first, and only those it finds near the
    #                                observation through the model (sipit.py: _drafted, _wants_draft)
    speculate_tokens: int | None = field(default=None, repr=False)  # guessed tokens a speculation or
    #                                lookahead row carries at first, doubling while right, uncapped where guesses
    #                                have been reliable (SipIt._guess); None: the device's (speculate_tokens_for)
    seed: int = 0  # random policy
    gradient: GradientConfig = field(default_factory=GradientConfig)
    calibration_tokens: int = 49_152  # learned policy: text + random-id tokens to fit on (one-time)
    learned: LearnedConfig | None = None  # learned policy: all its settings (e.g. LearnedConfig.fast());
    #                                       None: the defaults with calibration_tokens above


# A CPU pass costs more with every row past a few dozen (SmolLM2 ℓ = 15: 1 / 20 / 80 new tokens 37 / 78 /
# 123 ms); a GPU runs thousands of one-token rows in about the time of a few, so a weak ranker's long
# search takes fewer, wider passes there.
DEFAULT_BATCH = {"cpu": 256, "cuda": 4096}
# For the same reason a long speculation row costs a CPU more than a few short ones (SmolLM2, 200-token
# prompts: docs/results/invert/speculate_tokens.py); on a GPU rows of a few hundred tokens cost about
# what short ones do, so there only long prompts' rows are capped (not yet measured on a GPU).
DEFAULT_SPECULATE = {"cpu": 32, "cuda": 512}
# And a shared pass packs as many new tokens as a search pass takes candidates: a CPU's cost grows with them,
# a GPU's hardly (a full certificate of a 20-token prompt, V = 128,256: 627 passes of 4,096, not 2,505 of 1,024).
DEFAULT_PASS_TOKENS = {"cpu": 1024, "cuda": 4096}


def _for_device(config, name: str, defaults: dict, device, what: str) -> int:
    """config.<name>, or where it is None (or absent) defaults[device.type] (a torch.device; the CPU's
    for other devices). Raises InversionError below 1."""
    value = getattr(config, name, None)
    if value is not None and value < 1:
        raise InversionError(f"{what} must be at least 1, got {value}")
    return value if value is not None else defaults.get(device.type, defaults["cpu"])


def batch_size_for(config, device) -> int:
    """Candidates per search pass: config.batch_size or the device's default."""
    return _for_device(config, "batch_size", DEFAULT_BATCH, device, "batch size (candidates per pass)")


def speculate_tokens_for(config, device) -> int:
    """Guesses a speculation row carries at first: config.speculate_tokens or the device's default."""
    return _for_device(config, "speculate_tokens", DEFAULT_SPECULATE, device, "speculate_tokens")


def pass_tokens_for(config, device) -> int:
    """New tokens a shared pass takes at most: config.pass_tokens or the device's default."""
    return _for_device(config, "pass_tokens", DEFAULT_PASS_TOKENS, device, "pass_tokens")


def certify_top(certify: str, vocab_size: int) -> int:
    """"none" -> 0, "top:K" -> K, "full" -> vocab_size; anything else raises InversionError."""
    if certify == "none":
        return 0
    if certify == "full":
        return vocab_size
    if certify.startswith("top:") and certify[4:].isdigit() and int(certify[4:]) > 0:
        return int(certify[4:])
    raise InversionError(f"bad certify mode {certify!r}: expected none, top:K (K > 0) or full")
