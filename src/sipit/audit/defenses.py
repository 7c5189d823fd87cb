"""Defences a system might apply to what it stores or sends, and what each one leaves.

Written for states h [..., T, d]; every defence but project:k acts the same on any surface's rows
(K/V, logits, projected states: audit/surfaces.py applies it there).

    none          the states as computed
    noise:σ       per position, a random direction of norm σ‖h_t‖ (robust.add_noise)
    quant:F       stored in format F with one scale per row (position): int8, int4 (symmetric absmax
                  grid) or fp8 (e4m3, scale = absmax / 448), read back dequantized
    project:k     only k random orthonormal directions are kept: the observation is h Pᵀ [.., k]

Each defence gives the attacker an *observation* (`observe`) and the model a *residual stream* to
continue from (`residual`): the same as the observation except for project:k, where the model
continues from the reconstruction h Pᵀ P (the part of h in the kept subspace).

The attacker knows the defence (Kerckhoffs): for noise the level σ, for quantization the format
and the stored scales, so `quant_error_bound` gives the exact worst-case relative error of the
stored states — the ε of an attack that accepts the candidate within the format's error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..io import SipitError
from ..invert.robust import add_noise

FAMILIES = ("none", "noise", "quant", "project")
QUANT_LEVELS = {"int8": 127, "int4": 7}  # symmetric integer grids: q in [-qmax, qmax]
FP8_MAX, FP8_REL, FP8_SUB = 448.0, 2.0 ** -4, 2.0 ** -10  # e4m3: largest value, half ulp (normal), half subnormal step
QUANT_FORMATS = (*QUANT_LEVELS, "fp8")
QUANT_BITS = {"int8": 8, "fp8": 8, "int4": 4}


class DefenseError(SipitError):
    """A defence spec that cannot be parsed; the message lists the valid ones."""


@dataclass(frozen=True)
class Defense:
    family: str  # one of FAMILIES
    param: float | int | str | None = None  # σ, format, k

    @property
    def name(self) -> str:
        return self.family if self.param is None else f"{self.family}:{self.param:g}" \
            if isinstance(self.param, float) else f"{self.family}:{self.param}"

    @property
    def strength(self) -> float:
        """Orders a family from weakest to strongest: σ, 1/bits, 1/k."""
        if self.family == "noise":
            return float(self.param)
        if self.family == "quant":
            return 1.0 / QUANT_BITS[self.param] + (0.01 if self.param == "fp8" else 0.0)
        if self.family == "project":
            return 1.0 / self.param
        return 0.0

    def observe(self, states: Tensor, seed: int = 0) -> Tensor:
        """states [..., T, d] -> what is stored or leaked ([..., T, d]; project: [..., T, k])."""
        if self.family == "none":
            return states
        if self.family == "noise":  # add_noise draws its directions on the CPU
            gen = torch.Generator().manual_seed(seed)
            return add_noise(states.cpu(), float(self.param), gen).to(states.device)
        if self.family == "quant":
            return quantize_rows(states, self.param)
        return states @ projection(states.shape[-1], self.param, seed, states.device).T.to(states.dtype)

    def residual(self, states: Tensor, seed: int = 0) -> Tensor:
        """states [..., T, d] -> the states the model continues from ([..., T, d])."""
        if self.family == "project":
            P = projection(states.shape[-1], self.param, seed, states.device).to(states.dtype)  # [k, d]
            return states @ P.T @ P
        return self.observe(states, seed)


def parse_defenses(spec: str, d_model: int | None = None) -> list[Defense]:
    """'none,noise:0.01,0.1,quant:int8,fp8,project:64' -> defences (a bare value continues the last
    family). Raises DefenseError naming the bad item."""
    out, family = [], None
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, value = item.partition(":")
        if not sep and family not in (None, "none") and item != "none":  # 'noise:0.1,1' = 'noise:0.1,noise:1'
            name, value = family, item
        if name == "none" and not sep:
            d = Defense("none")
        elif name == "noise" and _is_number(value) and float(value) >= 0:
            d = Defense("noise", float(value)) if float(value) > 0 else Defense("none")
        elif name == "quant" and value in QUANT_FORMATS:
            d = Defense("quant", value)
        elif name == "project" and value.isdigit() and int(value) >= 1:
            if d_model is not None and int(value) > d_model:
                raise DefenseError(f"defence {item!r}: k={value} exceeds the model's d_model={d_model}")
            d = Defense("project", int(value))
        else:
            raise DefenseError(f"unknown defence {item!r}: use none, noise:SIGMA (relative, > 0), "
                               f"quant:{'|'.join(QUANT_FORMATS)} or project:K (1 <= K <= d_model)")
        family = d.family
        if d not in out:
            out.append(d)
    if not out:
        raise DefenseError("no defence given in --defenses")
    return out


def _is_number(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


def projection(d: int, k: int, seed: int, device=None) -> Tensor:
    """k random orthonormal rows in R^d, reproducible under seed. -> [k, d] float32"""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))
    return q.T.float().to(device)


def _row_scale(x: Tensor, top: float) -> Tensor:
    return (x.abs().amax(-1, keepdim=True) / top).clamp_min(torch.finfo(torch.float32).tiny)


def quantize_rows(states: Tensor, fmt: str) -> Tensor:
    """Round each row (position) of states [..., d] to `fmt` with its own absmax scale; dequantized."""
    x = states.float()
    if fmt == "fp8":
        s = _row_scale(x, FP8_MAX)
        return ((x / s).to(torch.float8_e4m3fn).float() * s).to(states.dtype)
    q = QUANT_LEVELS[fmt]
    s = _row_scale(x, q)
    return (torch.round(x / s).clamp(-q, q) * s).to(states.dtype)


def quant_error_bound(stored: Tensor, fmt: str) -> Tensor:
    """Worst-case relative error ‖h − stored‖ / ‖stored‖ per row of the dequantized stored [..., d],
    from the format alone (what an attacker who reads the file can compute). -> [...]"""
    x = stored.double()
    return quant_elementwise_bound(x, fmt).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-30)


def quant_elementwise_bound(stored: Tensor, fmt: str) -> Tensor:
    """b with |h − stored| ≤ b elementwise, for the dequantized stored [..., d] of `fmt`. -> [..., d] float64"""
    x = stored.double()
    if fmt == "fp8":
        s = _row_scale(x, FP8_MAX)
        # |h − x| ≤ 2⁻⁴|h| (normal) or half a subnormal step; |h| ≤ |x| / (1 − 2⁻⁴)
        return (FP8_REL / (1 - FP8_REL)) * x.abs() + FP8_SUB * s
    s = _row_scale(x, QUANT_LEVELS[fmt])  # the absmax element is stored exactly (q = ±qmax)
    return (s / 2).expand_as(x)
