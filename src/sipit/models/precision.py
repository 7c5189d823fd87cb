"""Numeric precision of a loaded model: float formats, and group-wise weight quantization.

    fp32 (default), fp64, bf16, fp16   weights *and* activations in that float format
    int8, int4                         symmetric absmax integer grid per group of `GROUP` weights
    nf4                                QLoRA's NormalFloat-4 codebook per group (absmax-scaled)
    fp4                                e2m1 values {0, .5, 1, 1.5, 2, 3, 4, 6}·s per group

Quantization is simulated with real rounding: every weight matrix (the token embedding and each
block's linear layers; norms and biases stay exact) is replaced by its dequantized value, and
activations run in float32. This is what a weight-only quantized kernel computes, up to the
order of float32 additions. The embedded GGUF models are already 4-bit in their files; "fp32"
means their dequantized weights as loaded.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .lm import LM, ModelError

GROUP = 64
FLOATS = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16}
NF4 = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0])
FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP4 = torch.cat([-FP4.flip(0)[:-1], FP4]) / 6.0  # symmetric, normalised to [-1, 1]
CODEBOOKS = {"int8": torch.arange(-127, 128) / 127.0, "int4": torch.arange(-7, 8) / 7.0, "nf4": NF4, "fp4": FP4}
PRECISIONS = (*FLOATS, *CODEBOOKS)


def quantize(w: Tensor, codebook: Tensor, group: int = GROUP) -> Tensor:
    """Round w [..., n] to codebook·absmax per group of `group` consecutive entries of a row."""
    flat = w.reshape(-1, w.shape[-1])
    pad = (-flat.shape[1]) % group
    g = torch.nn.functional.pad(flat, (0, pad)).reshape(flat.shape[0], -1, group)
    scale = g.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    # nearest codebook value, in chunks of rows to bound memory (codebooks have ≤ 255 entries)
    out = torch.empty_like(g)
    book = codebook.to(w.dtype)
    for i in range(0, g.shape[0], 256):
        x = g[i:i + 256] / scale[i:i + 256]
        idx = (x[..., None] - book).abs().argmin(-1) if len(book) <= 16 else _round_uniform(x, book)
        out[i:i + 256] = book[idx] * scale[i:i + 256]
    return out.reshape(flat.shape[0], -1)[:, : flat.shape[1]].reshape(w.shape)


def _round_uniform(x: Tensor, book: Tensor) -> Tensor:
    """Index of the nearest value on a uniform symmetric grid (int8: 255 levels)."""
    half = (len(book) - 1) // 2
    return (torch.round(x * half).clamp(-half, half) + half).long()


def apply_precision(lm: LM, precision: str, group: int = GROUP) -> LM:
    """Convert `lm` in place to `precision` (see module docstring) and record it on lm.precision."""
    if precision not in PRECISIONS:
        raise ModelError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision in FLOATS:
        if lm.dtype != FLOATS[precision]:  # models loaded in their dtype need no second cast
            lm.model.to(FLOATS[precision])
    else:
        book = CODEBOOKS[precision]
        with torch.no_grad():
            for module in [lm.embed, *(m for b in lm.blocks for m in b.modules())]:
                w = getattr(module, "weight", None)
                if isinstance(w, nn.Parameter) and w.dim() == 2:
                    w.copy_(quantize(w, book, group))
    lm.precision = precision
    lm.forget_fingerprint()
    return lm
