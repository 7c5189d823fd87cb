"""Temporary edits of the residual stream: replace the state at one layer, let the forward go on.

    with edit_layer(lm, 8, lambda h: h + 0.01 * torch.randn_like(h)):
        logits = lm.logits(ids)          # blocks > 8 see the edited state

Layer ℓ follows the tap's convention (0 = input of block 0, ℓ ≥ 1 = output of block ℓ, no final
norm). The hook is removed when the block exits, even on an error.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

from torch import Tensor

from .load import LM


@contextmanager
def edit_layer(lm: LM, layer: int, fn: Callable[[Tensor], Tensor]):
    """While inside, the residual stream at `layer` ([B, T, d]) is replaced by fn(states)."""
    layer = lm.layer_index(layer)

    def pre(module, args, kwargs):  # layer 0: the input of block 0
        if args:
            return (fn(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}

    def post(module, args, kwargs, out):  # layer ℓ ≥ 1: the output of block ℓ
        if isinstance(out, tuple):
            return (fn(out[0]), *out[1:])
        return fn(out)

    if layer == 0:
        handle = lm.blocks[0].register_forward_pre_hook(pre, with_kwargs=True)
    else:
        handle = lm.blocks[layer - 1].register_forward_hook(post, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
