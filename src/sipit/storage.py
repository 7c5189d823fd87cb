"""Observations stored in low precision, and the ε each storage format allows.

A system that stores states (or K/V, projections) to save space rounds them: fp16/bf16 casts,
fp8 (e4m3) or int8 with a scale per tensor or per row (the last dimension). Inversion stays exact
when the distance between the states of different tokens exceeds the rounding, so ε must cover it:
each format gives an elementwise bound |x − x̃| ≤ b (computed from the stored data and scales),
and a position's ε is ‖b‖ / ‖x̃‖ on top of the recomputation tolerance.

Stored as safetensors next to the observation tensor NAME: NAME (the codes: int8 / float8_e4m3fn
/ float16 / bfloat16) and, for scaled formats, NAME.scale (float32, [] per tensor or [..., 1] per
row); metadata `storage` = one of STORAGE.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .io import SipitError

STORAGE = ("fp32", "fp16", "bf16", "fp8", "int8", "int8-row")
_CAST = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_U = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp8": 2.0 ** -4}
_TINY = {"fp32": 2.0 ** -150, "fp16": 2.0 ** -25, "bf16": 2.0 ** -134}  # half the subnormal step: absolute
FP8_MAX, FP8_MIN_SUBNORMAL_STEP = 448.0, 2.0 ** -9  # float8_e4m3fn


def quantize(x: Tensor, fmt: str) -> dict[str, Tensor]:
    """x (float) -> {"codes": ..., "scale": ... (scaled formats only)} in storage format fmt."""
    if fmt not in STORAGE:
        raise SipitError(f"unknown storage format {fmt!r}; choose one of {', '.join(STORAGE)}")
    x = x.float()
    if fmt in _CAST:
        return {"codes": x.to(_CAST[fmt])}
    per_row = fmt in ("fp8", "int8-row")
    amax = x.abs().amax(-1, keepdim=True) if per_row else x.abs().max()
    top = FP8_MAX if fmt == "fp8" else 127.0
    scale = (amax / top).clamp_min(1e-30)
    codes = (x / scale).to(torch.float8_e4m3fn) if fmt == "fp8" else (x / scale).round().clamp(-127, 127).to(torch.int8)
    return {"codes": codes, "scale": scale}


def dequantize(codes: Tensor, scale: Tensor | None, fmt: str) -> tuple[Tensor, Tensor]:
    """Stored codes (+ scale) -> (x̃ float32, elementwise bound b with |x − x̃| ≤ b), same shape."""
    if fmt not in STORAGE:
        raise SipitError(f"unknown storage format {fmt!r} in the file; known: {', '.join(STORAGE)}")
    if (scale is None) != (fmt in _CAST):
        raise SipitError(f"storage {fmt}: the file {'lacks' if scale is None else 'has an unexpected'} scale tensor")
    x = codes.float() * (scale.float() if scale is not None else 1.0)
    if fmt in _CAST:  # relative rounding |x − x̃| ≤ u|x| ≤ u/(1−u)|x̃| for normals; subnormals: absolute
        return x, x.abs() * _U[fmt] / (1 - _U[fmt]) + _TINY[fmt]
    s = scale.float().expand_as(x)
    if fmt == "fp8":  # normals: relative 2^-4; subnormals: half the smallest step, absolute
        return x, x.abs() * _U["fp8"] / (1 - _U["fp8"]) + s * FP8_MIN_SUBNORMAL_STEP / 2
    return x, s / 2  # int8: half a quantization step


def storage_error(x: Tensor, bound: Tensor) -> float:
    """Relative error of stored observations x̃ [..., k] with elementwise bound b: max over vectors of
    ‖b‖/‖x̃‖ (added to the measured recomputation ε, see invert/eps.py)."""
    rel = bound.double().norm(dim=-1) / x.double().norm(dim=-1).clamp_min(1e-30)
    return float(rel.max())
