"""Layer taps: hidden states at layer ℓ, running only the blocks below it.

Every algorithm in sipit reads states through this module. The mechanism is one forward hook:
the base model is called as usual (so any HF decoder with a `layers` / `h` block list works, with
its own masks, rotary or learned positions and caches) and the hook on the last block needed
captures that block's output and stops the forward pass, so blocks above ℓ never run.

Layer ℓ = 0 is the input of block 0 (embeddings, plus learned positions for GPT-2); ℓ ≥ 1 is the
output of block ℓ (1-based). `final_norm=True` applies the model's final norm to that state
(at ℓ = L this is HF's `hidden_states[-1]`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from .lm import LM


class _Stop(Exception):
    """Raised by the capture hook once the highest requested layer has been computed."""


def _block_output(out) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def run_layers(lm: LM, layers: list[int], *, ids: Tensor | None = None, embeds: Tensor | None = None,
               cache=None, position_ids: Tensor | None = None, attention_mask: Tensor | None = None,
               final_norm: bool = False) -> list[Tensor]:
    """States at each of `layers` (normalised indices) for ids [B, T] or embeds [B, T, d].

    Runs blocks 0..max(layers)-1 only. With `cache` (a transformers Cache), the new tokens attend to
    it and it is updated in place for the blocks that run; attention_mask [B, cached + T] (1 = attend)
    hides padding in a batched cache. Returns one [B, T, d] tensor per layer.
    """
    wanted = sorted(set(layers))
    top = wanted[-1]
    got: dict[int, Tensor] = {}
    handles = []

    def keep(layer, h):
        got[layer] = h
        if layer == top:
            raise _Stop

    def block0_input(module, args, kwargs):  # pre-hook of block 0: layer 0
        keep(0, args[0] if args else kwargs["hidden_states"])

    def block_output(layer):  # forward hook of block layer-1: layer `layer`
        return lambda module, args, kwargs, out: keep(layer, _block_output(out))

    for layer in wanted:
        if layer == 0:
            handles.append(lm.blocks[0].register_forward_pre_hook(block0_input, with_kwargs=True))
        else:
            handles.append(lm.blocks[layer - 1].register_forward_hook(block_output(layer), with_kwargs=True))
    try:
        lm.run_base(cache, input_ids=ids, inputs_embeds=embeds, position_ids=position_ids,
                    attention_mask=attention_mask)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return [lm.norm(got[layer]) if final_norm else got[layer] for layer in layers]


@dataclass
class Prefix:
    """A verified prefix: its ids [T] and the KV cache of the blocks below the tap's layer."""

    ids: Tensor
    cache: object  # transformers Cache with batch size 1, or None for an empty prefix / layer 0

    @property
    def length(self) -> int:
        return len(self.ids)

    def crop(self, t: int) -> "Prefix":
        """The prefix of the first t tokens (a view; the original stays valid)."""
        if self.cache is None or t == self.length:
            return Prefix(self.ids[:t], self.cache if t else None)
        cache = copy.copy(self.cache)
        cache.layers = []
        for layer in self.cache.layers:
            layer = copy.copy(layer)
            if getattr(layer, "is_initialized", False):
                if getattr(layer, "is_sliding", False) and self.length >= layer.sliding_window - 1:
                    raise ValueError("cannot crop a sliding-window cache past its window; prefill again")
                layer.keys, layer.values = layer.keys[:, :, :t], layer.values[:, :, :t]
                if hasattr(layer, "cumulative_length"):
                    layer.cumulative_length = t
            cache.layers.append(layer)
        return Prefix(self.ids[:t], cache)


def _expand(cache, batch: int):
    """A fresh cache whose layers are batch-expanded *views* of `cache` (no copy, no mutation)."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        layer = copy.copy(layer)
        if getattr(layer, "is_initialized", False):
            layer.keys = layer.keys.expand(batch, -1, -1, -1)
            layer.values = layer.values.expand(batch, -1, -1, -1)
        new.layers.append(layer)
    return new


def _select(cache, b: int, t: int, start: int | None = None, n: int = 0):
    """A new cache holding row b of a batched cache: its first t positions, then (a padded cache,
    extend_many) the n positions from `start` on. Copies, so views die."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        layer = copy.copy(layer)
        if getattr(layer, "is_initialized", False):
            if getattr(layer, "is_sliding", False) and layer.cumulative_length > layer.keys.shape[-2]:
                raise ValueError("cannot select from a sliding-window cache past its window; prefill again")
            for name in ("keys", "values"):
                x = getattr(layer, name)
                kept = x[b:b + 1, :, :t].clone()
                if n:
                    kept = torch.cat([kept, x[b:b + 1, :, start:start + n]], 2)
                setattr(layer, name, kept)
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length = t + n
        new.layers.append(layer)
    return new


def _padded(caches: list, rows: list[int], length: int):
    """One cache of sum(rows) rows from batch-1 caches of different lengths: request i's cache
    repeated rows[i] times, right-padded with zeros to `length` positions (None: an empty prefix)."""
    template = next(c for c in caches if c is not None)
    new = copy.copy(template)
    new.layers = []
    for j, layer in enumerate(template.layers):
        layer = copy.copy(layer)
        if getattr(layer, "is_initialized", False):
            for name in ("keys", "values"):
                x = getattr(layer, name)  # [1, H, t, hd]
                out = x.new_zeros(sum(rows), x.shape[1], length, x.shape[3])
                r = 0
                for c, n in zip(caches, rows):
                    if c is not None:
                        y = getattr(c.layers[j], name)
                        out[r:r + n, :, :y.shape[2]] = y
                    r += n
                setattr(layer, name, out)
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length = length
        new.layers.append(layer)
    return new


class LayerTap:
    """States at one layer of `lm`: full sequences, or candidate tokens appended to a cached prefix.

    >>> tap = LayerTap(lm, layer=15)
    >>> h = tap.states(ids)                  # ids [B, T] -> [B, T, d]
    >>> p = tap.prefill(ids[0, :5])          # cache of the first 5 tokens
    >>> h5 = tap.extend(p, candidates)       # candidates [B] -> [B, d], states at position 5
    """

    def __init__(self, lm: LM, layer: int, final_norm: bool = False):
        self.lm = lm
        self.layer = lm.layer_index(layer)
        self.final_norm = final_norm

    plain_states = True  # observes the residual stream itself: a ranker may read the LM head off it

    @property
    def dim(self) -> int:
        """Size of one observed vector (what SipIt compares): the model width for raw states."""
        return self.lm.d_model

    @property
    def key(self) -> str:
        """What this tap observes, for caches keyed by (lm.fingerprint_through(blocks_read), key):
        e.g. "L15", "L30n"."""
        return f"L{self.layer}" + ("n" if self.final_norm else "")

    @property
    def blocks_read(self) -> int:
        """How many blocks (0..blocks_read-1) the observations depend on, besides the tensors outside
        the block list: the weights part of every per-tap cache key (`lm.fingerprint_through`). The
        same for KV and projection surfaces (block ℓ's cache is written inside block ℓ-1, 0-based)."""
        return self.layer

    def __repr__(self):
        return f"LayerTap({self.lm.name}, layer={self.layer}, final_norm={self.final_norm})"

    needs_cache = False  # from_pass reads the pass's KV cache (KVTap)

    def _run(self, **kw) -> Tensor:
        return run_layers(self.lm, [self.layer], final_norm=self.final_norm, **kw)[0]

    def from_pass(self, states: dict[int, Tensor], cache) -> Tensor:
        """This tap's observation [B, T, dim] read off one shared forward pass (`run_taps`): the states
        states[layer] [B, T, d] at every layer the pass's taps asked for, and the pass's KV cache."""
        h = states[self.layer]
        return self.lm.norm(h) if self.final_norm else h

    @torch.no_grad()
    def states(self, ids: Tensor) -> Tensor:
        """Full forward of ids [B, T] (or [T]) up to the layer. -> [B, T, d] (or [T, d])."""
        if ids.dim() == 1:
            return self.states(ids[None])[0]
        return self._run(ids=ids.to(self.lm.device))

    def states_from_embeds(self, embeds: Tensor) -> Tensor:
        """Differentiable: input embeddings [B, T, d] (as `lm.embed` outputs them) -> [B, T, d]."""
        return self._run(embeds=embeds)

    @torch.no_grad()
    def prefill(self, ids: Tensor, return_states: bool = False):
        """Cache the prefix ids [T]. Returns a Prefix (and its states [T, d] if asked)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.lm.device).reshape(-1)
        if len(ids) == 0 or self.layer == 0:
            states = self.states(ids) if return_states and len(ids) else ids.new_zeros(0, self.lm.d_model, dtype=self.lm.dtype)
            prefix = Prefix(ids, None)
        else:
            cache = self.lm.new_cache()
            states = self._run(ids=ids[None], cache=cache)[0]
            prefix = Prefix(ids, cache)
        return (prefix, states) if return_states else prefix

    def _extend(self, prefix: Prefix, k: int, batch: int, keep: bool = False, **inputs):
        positions = torch.arange(prefix.length, prefix.length + k, device=self.lm.device).expand(batch, k)
        cache = _expand(prefix.cache, batch) if prefix.cache is not None else None
        if cache is None and keep and self.layer > 0:
            cache = self.lm.new_cache()
        states = self._run(cache=cache, position_ids=positions, **inputs)
        return (states, cache) if keep else states

    @torch.no_grad()
    def extend(self, prefix: Prefix, ids: Tensor, keep: bool = False):
        """States of candidates appended to the prefix: ids [B] -> [B, d], or [B, k] -> [B, k, d].

        keep=True also returns `grown(b, n) -> Prefix`: the prefix followed by the first n tokens of
        row b, made from this call's cache (no recomputation; ids must be [B, k]).
        """
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.lm.device)
        if ids.dim() == 1 and not keep:
            return self.extend(prefix, ids[:, None])[:, 0]
        if not keep:
            return self._extend(prefix, ids.shape[1], ids.shape[0], ids=ids)
        states, cache = self._extend(prefix, ids.shape[1], ids.shape[0], keep=True, ids=ids)

        def grown(b: int, n: int) -> Prefix:
            new_ids = torch.cat([prefix.ids, ids[b, :n]])
            return Prefix(new_ids, _select(cache, b, len(new_ids)) if cache is not None and len(new_ids) else None)
        return states, grown

    @torch.no_grad()
    def extend_many(self, requests: list[tuple[Prefix, Tensor]], max_tokens: int = 1024) -> list[tuple[Tensor, object]]:
        """Many `extend(prefix, rows, keep=True)` calls served by few forward passes: what inverting
        many prompts in lock-step needs (their prefixes differ in content and length).

        requests: (prefix, rows [B_i, k_i]). A pass pads every row to its longest k, so the requests,
        longest first, are cut into consecutive passes by `pack` (fewest padded tokens plus
        PASS_TOKENS per pass; at most `max_tokens` padded tokens unless a request is larger alone: it
        runs alone, on views of its cache). Within a pass every prefix cache is right-padded to the
        longest, the padding masked out, and the new tokens of request i get positions t_i, t_i + 1, ...
        -> per request (states [B_i, k_i, dim], grown(b, n) -> Prefix)."""
        window = self._sliding_window()
        groups: dict = {}
        for i, (prefix, rows) in enumerate(requests):
            slides = window is not None and prefix.length + rows.shape[1] >= window - 1
            groups.setdefault(prefix.length if slides else None, []).append(i)  # padding would shift its window
        out: list = [None] * len(requests)
        for members in groups.values():
            members = sorted(members, key=lambda i: -requests[i][1].shape[1])
            for part in pack([tuple(requests[i][1].shape) for i in members], max_tokens):
                part = [members[j] for j in part]
                if len(part) == 1:
                    out[part[0]] = self.extend(*requests[part[0]], keep=True)
                else:
                    for i, r in zip(part, self._extend_padded([requests[i] for i in part])):
                        out[i] = r
        return out

    def _sliding_window(self) -> int | None:
        """The attention window of the model's sliding layers, if it has any (None: no window)."""
        return getattr(self.lm.model.config, "sliding_window", None) or None

    def _extend_padded(self, requests: list[tuple[Prefix, Tensor]]) -> list[tuple[Tensor, object]]:
        """One forward pass for several requests (extend_many): caches padded to the longest prefix P
        and masked, rows padded to the longest K. -> per request (states [B_i, k_i, dim], grown)."""
        dev = self.lm.device
        sizes = [rows.shape[0] for _, rows in requests]
        lengths = [prefix.length for prefix, _ in requests]
        P, K = max(lengths), max(rows.shape[1] for _, rows in requests)
        ids = torch.cat([torch.nn.functional.pad(rows.to(dev), (0, K - rows.shape[1])) for _, rows in requests])
        positions = torch.cat([torch.arange(t, t + K, device=dev).expand(n, K) for t, n in zip(lengths, sizes)])
        cache = mask = None
        if self.layer > 0:
            if P > 0:
                cache = _padded([prefix.cache for prefix, _ in requests], sizes, P)
                mask = torch.ones(len(ids), P + K, dtype=torch.long, device=dev)
                r = 0
                for t, n in zip(lengths, sizes):
                    mask[r:r + n, t:P] = 0
                    r += n
            else:
                cache = self.lm.new_cache()
        states = self._run(ids=ids, cache=cache, position_ids=positions, attention_mask=mask)
        results, r = [], 0
        for (prefix, rows), t, n in zip(requests, lengths, sizes):
            def grown(b: int, m: int, prefix=prefix, rows=rows, t=t, r=r) -> Prefix:
                new_ids = torch.cat([prefix.ids, rows[b, :m].to(dev)])
                if cache is None or len(new_ids) == 0:
                    return Prefix(new_ids, None)
                return Prefix(new_ids, _select(cache, r + b, t, P, m))
            results.append((states[r:r + n, :rows.shape[1]], grown))
            r += n
        return results

    @torch.no_grad()
    def extend_layers(self, prefix: Prefix, ids: Tensor, layers: list[int]) -> list[Tensor]:
        """Candidates ids [B] appended to the prefix, states at several layers ≤ the tap's layer in
        one pass (blocks above max(layers) never run). -> one [B, d] tensor per entry of `layers`."""
        layers = [self.lm.layer_index(layer) for layer in layers]
        if max(layers) > self.layer:
            raise ValueError(f"layers {layers} above the tap's layer {self.layer}: its prefix cache stops there")
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.lm.device)[:, None]
        positions = torch.arange(prefix.length, prefix.length + 1, device=self.lm.device).expand(len(ids), 1)
        cache = _expand(prefix.cache, len(ids)) if prefix.cache is not None else None
        states = run_layers(self.lm, layers, ids=ids, cache=cache, position_ids=positions, final_norm=self.final_norm)
        return [h[:, 0] for h in states]

    def extend_embeds(self, prefix: Prefix, embeds: Tensor) -> Tensor:
        """Differentiable: embeds [B, d] -> [B, d], or [B, k, d] -> [B, k, d]."""
        if embeds.dim() == 2:
            return self.extend_embeds(prefix, embeds[:, None])[:, 0]
        return self._extend(prefix, embeds.shape[1], embeds.shape[0], embeds=embeds)


PASS_TOKENS = 32  # what one more forward pass costs, in padded tokens: reading the weights once (SmolLM2
#                  layer 15 on this 2-core CPU: ~30 ms a pass, ~1 ms a token of a lock-step batch)


def pack(shapes: list[tuple[int, int]], max_tokens: int) -> list[list[int]]:
    """Cut requests of (rows n_i, length k_i), longest first, into consecutive passes, each padded to its
    first k: the cut with the least Σ (PASS_TOKENS + rows · k_first), a pass at most max_tokens padded
    tokens unless it is one request (dynamic programming over the cut points). -> lists of indices.
    (Lock-step rounds after the first carry rows of many lengths: SmolLM2 layer 15, 32 prompts, 617
    tokens padded to 848 when any row at least half as long as the first could share a pass.)"""
    n = len(shapes)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j requests
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        rows = 0
        for i in range(j - 1, -1, -1):  # the last pass holds requests i..j-1, padded to k_i
            rows += shapes[i][0]
            tokens = rows * shapes[i][1]
            if tokens > max_tokens and i < j - 1:
                break
            if best[i] + PASS_TOKENS + tokens < best[j]:
                best[j], cut[j] = best[i] + PASS_TOKENS + tokens, i
    parts, j = [], n
    while j > 0:
        parts.append(list(range(cut[j], j)))
        j = cut[j]
    return parts[::-1]


@torch.no_grad()
def position0_tables(observe, V: int, device, batch: int = 1024, desc: str = "") -> list[Tensor]:
    """Every token's observation at position 0 (it depends on that token only), for each target of
    observe: ids [B, 1] -> one [B, 1, d] tensor per target (e.g. `run_taps` or `[tap.states(ids)]`).
    What the learned calibration's table and the permutation search read. -> list of [V, d] float32"""
    from tqdm import tqdm

    parts = [observe(torch.arange(i, min(V, i + batch), device=device)[:, None])
             for i in tqdm(range(0, V, batch), desc=f"{desc}: position-0 table", leave=False, disable=None)]
    return [torch.cat([p[j][:, 0].float() for p in parts]) for j in range(len(parts[0]))]


@torch.no_grad()
def run_taps(lm: LM, taps: list, ids: Tensor) -> list[Tensor]:
    """Every tap's observation of ids [B, T] from one forward pass of `lm` (states, projections, KV
    caches, at any layers: blocks above the highest tap's layer never run). -> [B, T, tap.dim] per tap.
    What the calibration of many surfaces shares: one pass instead of one per tap."""
    layers = sorted({t.layer for t in taps})
    cache = lm.new_cache() if any(t.needs_cache for t in taps) else None
    states = dict(zip(layers, run_layers(lm, layers, ids=ids.to(lm.device), cache=cache)))
    dtype = taps[0].lm.dtype  # `lm` may be a lower-precision copy of the taps' LM (LM.copy_in)
    states = {layer: h.to(dtype) for layer, h in states.items()}
    return [t.from_pass(states, cache) for t in taps]
