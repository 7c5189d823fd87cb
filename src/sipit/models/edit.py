"""Temporary edits inside the forward pass: replace the state at one layer (or one block's KV cache),
let the forward go on.

    with edit_layer(lm, 8, lambda h: h + 0.01 * torch.randn_like(h)):
        logits = lm.logits(ids)          # blocks > 8 see the edited state
    with edit_kv(lm, 8, lambda k, v: (k.round(), v)):
        logits = lm.logits(ids)          # block 8's attention reads (and caches) the edited keys

Layer ℓ follows the tap's convention (0 = input of block 0, ℓ ≥ 1 = output of block ℓ, no final
norm). The hook is removed when the block exits, even on an error.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

from torch import Tensor

from .load import LM
from .lm import attention_module, cache_keyword


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


class _EditedCache:
    """Stands in for the cache one attention module receives: the new keys and values [B, H, T, hd]
    pass through fn before they are stored (when there is a real cache) and attended to."""

    def __init__(self, cache, fn: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]):
        self.cache, self.fn = cache, fn

    def update(self, keys: Tensor, values: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        keys, values = self.fn(keys, values)
        return (keys, values) if self.cache is None else self.cache.update(keys, values, *args, **kwargs)


@contextmanager
def edit_kv(lm: LM, layer: int, fn: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]):
    """While inside, block `layer`'s (≥ 1) new keys and values [B, n_kv_heads, T, head_dim] (keys after
    rotary, as HF caches them) are replaced by fn(keys, values): what the block stores and attends to,
    so every later position and block sees the edited cache."""
    layer = lm.layer_index(layer)
    if layer == 0:
        raise ValueError("a KV edit needs a block: layer ≥ 1 means block ℓ's cache")

    attention = attention_module(lm, layer - 1)
    key = cache_keyword(attention)

    def pre(module, args, kwargs):
        return args, {**kwargs, key: _EditedCache(kwargs.get(key), fn)}

    handle = attention.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
