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
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from .device import batch_for
from .lm import LM, ModelError, one_token_attention


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
    hides padding in a batched cache. One-token sequences without a cache or mask (each token its own prompt) skip
    what attention to one key cannot change (lm.one_token_attention: the same states). Returns one [B, T, d]
    tensor per layer.
    """
    wanted = sorted(set(layers))
    top = wanted[-1]
    got: dict[int, Tensor] = {}
    handles = []

    streams = lm.streams

    def keep(layer, h):
        got[layer] = h if streams == 1 else h.permute(1, 2, 0, 3).flatten(2)  # Gemma-3n's [A, B, T, d] side by side
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
    one_key = cache is None and attention_mask is None and (ids if ids is not None else embeds).shape[1] == 1
    try:
        with one_token_attention(lm) if one_key else nullcontext():
            lm.run_base(cache, input_ids=ids, inputs_embeds=embeds, position_ids=position_ids,
                        attention_mask=attention_mask)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    skipped = [layer for layer in wanted if layer not in got]
    if skipped:  # (Mllama's cross-attention blocks, without an image)
        raise ModelError(f"{lm.name}: block(s) {[layer - 1 for layer in skipped]} (0-based) did not run on this input, "
                         f"so layer(s) {skipped} have no state of their own to read: choose another layer "
                         "(transformers' hidden_states leave such blocks out: above them its hidden_states[k] is a "
                         "higher layer here)")
    return [lm.norm(got[layer]) if final_norm else got[layer] for layer in layers]


@dataclass
class Prefix:
    """A verified prefix: its ids [T] and the KV cache of the blocks below the tap's layer."""

    ids: Tensor
    made: object = None  # transformers Cache with batch size 1, or None for an empty prefix / layer 0 ...
    make: Callable[[], object] | None = field(default=None, repr=False)  # ... or what copies it out of a pass's
    #     batched cache on first use (a pass's grown prefixes: most are never extended, e.g. a prompt's last)
    regrow: Callable[..., object] | None = field(default=None, repr=False)  # a recurrent model's (LM.recurrent): the
    #     cache of ids [t] made anew, or grown from a shorter made Prefix of them, as crop makes a shorter prefix's
    #     (its state cannot be cut back: LayerTap.regrow)
    last_crop: "Prefix | None" = field(default=None, repr=False)  # (regrow: the crop asked for last)

    @property
    def cache(self):
        if self.make is not None:
            self.made, self.make = self.make(), None  # (drops the pass's cache with the closure)
        return self.made

    @property
    def length(self) -> int:
        return len(self.ids)

    def crop(self, t: int) -> "Prefix":
        """The prefix of the first t tokens (a view; the original stays valid)."""
        if t == self.length:
            return self
        if t == 0 or (self.make is None and self.made is None):  # (t = 0 leaves a lazy cache unmade)
            return Prefix(self.ids[:t], None, regrow=self.regrow)
        if self.regrow is not None:  # (certificates crop at t = 0, 1, 2, ...: each grown from the one before by a
            #                           pass of one token, the prompt once in all, where anew they cost T²/2 tokens)
            ids, base = self.ids[:t], self.last_crop
            grow = base is not None and 0 < base.length <= t
            self.last_crop = Prefix(ids, make=lambda: self.regrow(ids, base if grow and base.make is None else None),
                                    regrow=self.regrow)
            return self.last_crop
        if any(_recurrent(layer) for layer in self.cache.layers):
            raise RuntimeError("a recurrent cache cannot be cut back: give its Prefix a regrow (LayerTap.regrow)")
        cache = copy.copy(self.cache)
        cache.layers = []
        for layer in self.cache.layers:
            layer = copy.copy(layer)
            if _holds_keys(layer):
                layer.keys, layer.values = layer.keys[:, :, :t], layer.values[:, :, :t]
            cache.layers.append(layer)
        return Prefix(self.ids[:t], cache)


def _holds_keys(layer) -> bool:
    """Whether a cache layer holds keys and values (a block that attends, once a pass filled it; a MoE or MLP block's
    placeholder layer, Nemotron-H's, holds none)."""
    return getattr(layer, "is_initialized", False) and layer.keys is not None


def _recurrent(layer) -> bool:
    """Whether a cache layer holds recurrent states (transformers' linear-attention layers: conv and recurrent
    states [B, ...], filled in place by the pass that reads them)."""
    return hasattr(layer, "recurrent_states")


def _with_states(layer, make: Callable[[str, int, Tensor], Tensor]):
    """A shallow copy of a cache layer whose recurrent states (if any) are make(name, i, state) for each state
    `name`[i] ("conv_states" or "recurrent_states"): new tensors in dicts of its own, so a pass that updates them in
    place leaves the original as it was."""
    layer = copy.copy(layer)
    if _recurrent(layer):
        for key, value in vars(layer).items():
            if isinstance(value, dict):
                setattr(layer, key, dict(value))
        for name in ("conv_states", "recurrent_states"):
            states = getattr(layer, name)
            for i, x in states.items():
                if x is not None:
                    states[i] = make(name, i, x)
    return layer


def _expand(cache, batch: int):
    """A fresh cache whose layers are batch-expanded *views* of `cache` (no copy, no mutation; recurrent states,
    which a pass updates in place, copied)."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        layer = _with_states(layer, lambda name, i, x: x.repeat(batch, *[1] * (x.dim() - 1)))
        if _holds_keys(layer):
            layer.keys = layer.keys.expand(batch, -1, -1, -1)
            layer.values = layer.values.expand(batch, -1, -1, -1)
        new.layers.append(layer)
    return new


def _select(cache, b: int, spans: list[tuple[int, int]]):
    """A new batch-1 cache of row b of a (batched) cache: the positions of each span (start, length),
    one after another (a prefix's own positions, then a row's new ones). Copies, so views die."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        layer = copy.copy(layer)
        if _holds_keys(layer):
            for name in ("keys", "values"):
                x = getattr(layer, name)
                setattr(layer, name, torch.cat([x[b:b + 1, :, s:s + n] for s, n in spans if n], 2))  # a copy
        new.layers.append(layer)
    return new


def _padded(caches: list, rows: list[int], length: int):
    """One cache of sum(rows) rows from batch-1 caches of different lengths: request i's cache
    repeated rows[i] times, right-padded with zeros to `length` positions (None: an empty prefix, whose
    recurrent states are zeros: what a first pass starts from)."""
    template = next(c for c in caches if c is not None)
    new = copy.copy(template)
    new.layers = []
    for j, layer in enumerate(template.layers):
        layer = _with_states(layer, lambda name, i, x, j=j: torch.cat([
            x.new_zeros(n, *x.shape[1:]) if c is None else getattr(c.layers[j], name)[i].expand(n, *x.shape[1:])
            for c, n in zip(caches, rows)]))
        if _holds_keys(layer):
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
        new.layers.append(layer)
    return new


def _joined(caches: list):
    """One batch-1 cache: batch-1 caches one after another along the positions (extend_many's flat pass)."""
    new = copy.copy(caches[0])
    new.layers = []
    for j, layer in enumerate(caches[0].layers):
        layer = copy.copy(layer)
        if _holds_keys(layer):
            for name in ("keys", "values"):
                setattr(layer, name, torch.cat([getattr(c.layers[j], name) for c in caches], 2))
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

    @cached_property
    def _costs(self) -> tuple[float, float]:
        """pass_costs(lm): (a query-key pair's, a copied cached position's) cost in tokens, for pack."""
        return pass_costs(self.lm)

    def rows_that_fit(self, length: int, cap: int) -> int:
        """How many rows of `length` positions (the prefix's and one new token) a pass can hold in half
        the device's free memory, at most cap (cap where free memory is unknown: a CPU). A pass writes
        every row its own copy of the prefix's keys and values in each block (transformers' cache
        concatenates), so on a GPU 4,096 rows of an 8B model on a 512-token prefix would need ~270 GB."""
        per_position, fixed = self._row_bytes
        return batch_for(self.lm.device, length * per_position + fixed, cap=cap)

    @cached_property
    def _row_bytes(self) -> tuple[int, int]:
        """(bytes a row needs per position: keys and values in every block read, float32 attention
        scores; bytes it needs anyway: the MLP's widest activations)"""
        heads, kv_heads, head_dim = attention_shape(self.lm)
        wide = self.lm.config_value("intermediate_size") or 4 * self.lm.config_value("hidden_size")
        size = self.lm.dtype.itemsize
        return self.blocks_read * 2 * kv_heads * head_dim * size + 4 * heads, 4 * wide * size + self._state_bytes

    @cached_property
    def _state_bytes(self) -> int:
        """Bytes of the recurrent states a row's cache holds in the blocks read (LM.recurrent; Qwen3.5's gated delta
        nets ~1 MB a block), read off a one-token prefix; 0 for attention only."""
        if not self.lm.recurrent or self.blocks_read == 0:
            return 0
        cache = self._one_token_cache
        return sum(x.numel() * x.element_size() for layer in cache.layers if _recurrent(layer)
                   for states in (layer.conv_states, layer.recurrent_states) for x in states.values() if x is not None)

    plain_states = True  # observes the residual stream itself: a ranker may read the LM head off it

    @property
    def dim(self) -> int:
        """Size of one observed vector (what SipIt compares): the residual stream's width, or with the final norm
        what the LM head reads (OPT-350m: project_out's 512, not the blocks' 1024)."""
        return self.lm.model.get_output_embeddings().weight.shape[1] if self.final_norm else self.lm.d_model

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

    def _run_on(self, cache, cached: bool, **inputs) -> Tensor:
        """_run of new tokens (ids or embeds, position_ids [B, k], attention_mask [B, P + k]) on `cache`, which holds
        a prefix if `cached`: then a token at a time where the model's multi-token scans would start from zeros
        instead of the cache's state (LM.scans_from_zero: Jamba's Mamba blocks were 1e-4 off, the state of a random
        tiny model being small)."""
        rows, k = next(x for name, x in inputs.items() if name in ("ids", "embeds")).shape[:2]
        if not cached and k == 1 and self.lm.recurrent and self.layer > 0:
            return self._run(cache=self._zero_states(cache, rows), **inputs)
        if not cached or k == 1 or not self.lm.scans_from_zero:
            return self._run(cache=cache, **inputs)
        mask = inputs.pop("attention_mask", None)
        steps = []
        for j in range(k):
            step = {name: x[:, j:j + 1] for name, x in inputs.items()}
            if mask is not None:
                step["attention_mask"] = mask[:, :mask.shape[1] - k + j + 1]
            steps.append(self._run(cache=cache, **step))
        return torch.cat(steps, 1)

    def _zero_states(self, cache, rows: int):
        """`cache` (new and empty; None: a cache of this pass only) with every recurrent layer holding the zero states
        of `rows` rows, as after no token, so that a one-token pass takes the model's recurrent step: its chunked scan
        pads the token to a chunk (64 tokens in a gated delta net, 256 in a Mamba-2 block by default) on
        transformers' reference kernels (no flash-linear-attention, mamba_ssm). The same states (within the noise ε
        measures on these passes); SipIt's first position and the position-0 table are passes of one token."""
        def zeroed(one):  # the layer a one-token prefix leaves, its states zero
            one = _with_states(one, lambda name, i, x: x.new_zeros(rows, *x.shape[1:]))
            if _holds_keys(one):  # (Falcon-H1's hybrid blocks: the attention part holds no key yet)
                one.keys, one.values, one.is_initialized = None, None, False
            return one

        cache = cache if cache is not None else self.lm.new_cache(self.blocks_read)
        cache.layers = [zeroed(one) if _recurrent(one) else layer
                        for one, layer in zip(self._one_token_cache.layers, cache.layers)]
        return cache

    @cached_property
    def _one_token_cache(self):
        """The cache a one-token prefix leaves (a recurrent model's: its states' shapes and flags)."""
        return self.prefill(torch.zeros(1, dtype=torch.long)).cache

    def from_pass(self, states: dict[int, Tensor], cache) -> Tensor:
        """This tap's observation [B, T, dim] read off one shared forward pass (`run_taps`): the states
        states[layer] [B, T, d] at every layer the pass's taps asked for, and the pass's KV cache."""
        h = states[self.layer]
        return self.lm.norm(h) if self.final_norm else h

    @torch.no_grad()
    def states(self, ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None) -> Tensor:
        """Full forward of ids [B, T] up to the layer, with a padded batch's attention_mask [B, T] (1 = attend) and
        position_ids [B, T] if given (else the model's: 0..T-1). -> [B, T, d]; [T] -> [T, d] (no mask)."""
        if ids.dim() == 1:
            return self.states(ids[None])[0]
        ids = ids.to(self.lm.device)
        given = {name: x.to(self.lm.device) for name, x in (("attention_mask", attention_mask),
                                                             ("position_ids", position_ids)) if x is not None}
        if given:
            return self._run(ids=ids, **given)
        if ids.shape[1] == 1 and self.lm.recurrent:  # (one-token sequences: _run_on's recurrent step)
            return self._run_on(None, False, ids=ids, position_ids=torch.zeros_like(ids))
        return self._run(ids=ids)

    def states_from_embeds(self, embeds: Tensor) -> Tensor:
        """Differentiable: input embeddings [B, T, d] (as `lm.embed` outputs them) -> [B, T, d]."""
        return self._run(embeds=embeds)

    @torch.no_grad()
    def prefill(self, ids: Tensor, return_states: bool = False):
        """Cache the prefix ids [T]. Returns a Prefix (and its states [T, d] if asked)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.lm.device).reshape(-1)
        if len(ids) == 0 or self.layer == 0:
            states = self.states(ids) if return_states and len(ids) else ids.new_zeros(0, self.dim, dtype=self.lm.dtype)
            prefix = Prefix(ids, None, regrow=self.regrow)
        else:
            cache = self.lm.new_cache(self.blocks_read)
            states = self._run(ids=ids[None], cache=cache)[0]
            prefix = Prefix(ids, cache, regrow=self.regrow)
        return (prefix, states) if return_states else prefix

    @cached_property
    def regrow(self) -> Callable[..., object] | None:
        """What Prefix.crop needs of a recurrent model (LM.recurrent; None elsewhere): regrow(ids [t], base=None) ->
        the cache of ids made anew, or grown from `base`, a Prefix of their first tokens whose cache is made, by a pass
        of the rest on a copy of it (the base stays as it was)."""
        def regrow(ids: Tensor, base: Prefix | None = None):
            if base is None:
                return self.prefill(ids).cache
            return self._grown(base, ids[base.length:]).cache

        return regrow if self.lm.recurrent else None

    def _grown(self, prefix: Prefix, ids: Tensor) -> Prefix:
        """A recurrent model's prefix followed by ids [n]: its cache made on first use by a pass of the n tokens on a
        copy of the prefix's (a pass's cache holds each row's state after its last token only, and cannot be cut
        back to an earlier one)."""
        if len(ids) == 0:
            return prefix
        return Prefix(torch.cat([prefix.ids, ids]), make=lambda: self._extend(prefix, len(ids), 1, keep=True,
                                                                             ids=ids[None])[1], regrow=self.regrow)

    def _extend(self, prefix: Prefix, k: int, batch: int, keep: bool = False, **inputs):
        positions = torch.arange(prefix.length, prefix.length + k, device=self.lm.device).expand(batch, k)
        cache = _expand(prefix.cache, batch) if prefix.cache is not None else None
        if cache is None and keep and self.layer > 0:
            cache = self.lm.new_cache(self.blocks_read)
        states = self._run_on(cache, prefix.cache is not None, position_ids=positions, **inputs)
        return (states, cache) if keep else states

    @torch.no_grad()
    def extend(self, prefix: Prefix, ids: Tensor, keep: bool = False, layout: str | None = None):
        """States of candidates appended to the prefix: ids [B] -> [B, d], or [B, k] -> [B, k, d].

        keep=True also returns `grown(b, n) -> Prefix`: the prefix followed by the first n tokens of
        row b, made from this call's cache (no recomputation; ids must be [B, k]).
        layout: "padded" (a batch of B rows, each with its own copy of the prefix's cache), "flat"
        (_extend_flat: one row holding the prefix once and every candidate's tokens; padded where the
        rows need their keys in place, _in_place, or where a recurrent state would run through every row's tokens:
        LM.recurrent), or None: whichever `pack`
        estimates cheaper (SmolLM2 layer 15, 256 candidates after 200 / 600 tokens: padded 522 / 1,248 ms,
        flat 177 / 222 ms; docs/results/invert/flat_passes.py).
        """
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.lm.device)
        if ids.dim() == 1 and not keep:
            return self.extend(prefix, ids[:, None], layout=layout)[:, 0]
        if layout not in (None, "flat", "padded"):
            raise ValueError(f"layout must be 'flat', 'padded' or None, got {layout!r}")
        if self._in_place(prefix.length, ids.shape[1]) or self.lm.recurrent:
            layout = "padded"
        elif layout is None:
            layout = "flat" if pack([(prefix.length, *ids.shape)], FLAT_KEYS, *self._costs)[0][1] else "padded"
        if layout == "flat":
            states, grown = self._extend_flat([(prefix, ids)])[0]
            return (states, grown) if keep else states
        if not keep:
            return self._extend(prefix, ids.shape[1], ids.shape[0], ids=ids)
        states, cache = self._extend(prefix, ids.shape[1], ids.shape[0], keep=True, ids=ids)

        def grown(b: int, n: int) -> Prefix:
            if self.lm.recurrent:
                return self._grown(prefix, ids[b, :n])
            new_ids = torch.cat([prefix.ids, ids[b, :n]])
            if cache is None or len(new_ids) == 0:
                return Prefix(new_ids, None)
            return Prefix(new_ids, make=lambda: _select(cache, b, [(0, len(new_ids))]))
        return states, grown

    @torch.no_grad()
    def extend_many(self, requests: list[tuple[Prefix, Tensor]], max_tokens: int = 1024,
                    layout: str | None = None) -> list[tuple[Tensor, object]]:
        """Many `extend(prefix, rows, keep=True)` calls served by few forward passes: what inverting
        many prompts in lock-step needs (their prefixes differ in content and length).

        requests: (prefix, rows [B_i, k_i]). Cut by `pack` into passes of at most `max_tokens` tokens
        (a request larger alone runs alone), each padded (_extend_padded: rows padded to the longest,
        caches to the longest prefix, the padding masked out) or flat (_extend_flat: every row's tokens
        in one sequence), whichever its estimated cost favours. Requests whose positions reach a
        sliding window (Gemma-3, Mistral), and every request of an ALiBi model (BLOOM, MPT), never go flat and
        share padded passes only with those of their prefix length (_in_place); a recurrent or 16-bit model's
        never go flat.
        layout: "padded" or "flat" makes every pass that one where it may be (eps.measure_noise measures both).
        -> per request (states [B_i, k_i, dim], grown(b, n) -> Prefix)."""
        groups: dict = {}
        for i, (prefix, rows) in enumerate(requests):
            groups.setdefault(prefix.length if self._in_place(prefix.length, rows.shape[1]) else None, []).append(i)
        out: list = [None] * len(requests)
        for length, members in groups.items():
            members = sorted(members, key=lambda i: -requests[i][1].shape[1])
            shapes = [(requests[i][0].length, *requests[i][1].shape) for i in members]
            # a 16-bit model's requests never share a flat pass: SmolLM2 in bfloat16 (this project's CPU), position
            # 1 after ' In' in a flat pass of 8-24 lock-step requests 10-13% from one full forward at layer 15,
            # 1.6% padded, and eps (4x the largest noise) 0.42, within which wrong tokens were accepted
            # (docs/results/precision/bf16-inversion/)
            flat_ok = length is None and not self.lm.recurrent and not self.lm.half
            for part, flat in pack(shapes, max_tokens, *self._costs, flat=flat_ok):
                part = [members[j] for j in part]
                if layout is not None:
                    flat = layout == "flat" and flat_ok
                if len(part) == 1:
                    out[part[0]] = self.extend(*requests[part[0]], keep=True, layout="flat" if flat else "padded")
                else:
                    run = self._extend_flat if flat else self._extend_padded
                    for i, r in zip(part, run([requests[i] for i in part])):
                        out[i] = r
        return out

    def _extend_flat(self, requests: list[tuple[Prefix, Tensor]]) -> list[tuple[Tensor, object]]:
        """One forward pass of batch 1 for several requests (extend_many): the distinct prefixes' caches
        one after another (S keys), then every row's tokens (N), each row's at its own positions
        t_i, t_i + 1, ...; a [N, S + N] mask lets a token see its own prefix and the tokens before it
        in its own row. Unlike padding rows to the longest (_extend_padded), the pass costs the new
        tokens it has (SmolLM2 layer 15, a lock-step round of 42 requests, 290 tokens: 3 padded passes
        of 360 tokens). -> per request (states [B_i, k_i, dim], grown)."""
        dev = self.lm.device
        segments: dict[int, tuple[int, Prefix]] = {}  # id(prefix) -> (its first key, prefix): each once
        for prefix, _ in requests:
            if id(prefix) not in segments:
                segments[id(prefix)] = (sum(p.length for _, p in segments.values()), prefix)
        S = sum(p.length for _, p in segments.values())
        ids = torch.cat([rows.reshape(-1).to(dev) for _, rows in requests])[None]  # [1, N] (rows on either device)
        N = ids.shape[1]
        lengths = torch.tensor([rows.shape[1] for _, rows in requests for _ in range(rows.shape[0])])
        row = torch.arange(len(lengths)).repeat_interleave(lengths)  # [N]: which row each token is in
        see = row[:, None] == row[None, :]  # [N, N]: its own row ...
        see &= torch.ones(N, N, dtype=torch.bool).tril()  # ... up to itself
        own = torch.zeros(N, S, dtype=torch.bool)  # its own prefix
        positions, at = [], 0
        for prefix, rows in requests:
            start = segments[id(prefix)][0]
            own[at:at + rows.numel(), start:start + prefix.length] = True
            positions.append(torch.arange(prefix.length, prefix.length + rows.shape[1]).repeat(rows.shape[0]))
            at += rows.numel()
        cache = mask = None
        if self.layer > 0:
            cached = [p.cache for _, p in segments.values() if p.cache is not None]
            cache = _joined(cached) if S else self.lm.new_cache(self.blocks_read)
            allowed = torch.cat([own, see], 1).to(dev)[None, None]  # [1, 1, N, S + N]
            mask = torch.zeros(allowed.shape, dtype=self.lm.dtype, device=dev).masked_fill_(
                ~allowed, torch.finfo(self.lm.dtype).min)  # additive: eager and sdpa attention alike
        states = self._run(ids=ids, cache=cache, position_ids=torch.cat(positions).to(dev)[None], attention_mask=mask)[0]
        results, at = [], 0
        for prefix, rows in requests:
            n, k = rows.shape
            def grown(b: int, m: int, prefix=prefix, rows=rows, first=S + at) -> Prefix:
                new_ids = torch.cat([prefix.ids, rows[b, :m].to(dev)])
                if cache is None or len(new_ids) == 0:
                    return Prefix(new_ids, None)
                prefix_span = (segments[id(prefix)][0], prefix.length)
                return Prefix(new_ids, make=lambda: _select(cache, 0, [prefix_span, (first + b * rows.shape[1], m)]))
            results.append((states[at:at + n * k].view(n, k, -1), grown))
            at += n * k
        return results

    def _in_place(self, t: int, k: int) -> bool:
        """Whether rows of k tokens after a t-token prefix need every key at the index of its position, so go padded,
        sharing a pass only with rows after prefixes of their length: where they reach the attention window of the
        model's sliding layers (Gemma-3, Mistral; a flat pass's mask has no window, padding would shift it), and
        always where attention biases a key by its index (ALiBi: BLOOM, MPT; LM.keys_by_index) or the model computes
        in 16 bits: its attention kernels round by where the keys lie (SmolLM2 in bfloat16, layer 15, fresh seed 1277:
        position 1 after ' spontaneous', the truth ' road' 5.2% from the observation in a pass of its own, within ε,
        and not within ε in a lock-step pass whose longer prefixes shifted its key; a wrong token was accepted)."""
        window = self.lm.sliding_window
        return self.lm.keys_by_index or self.lm.half or (window is not None and t + k >= window - 1)

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
                cache = self.lm.new_cache(self.blocks_read)
        states = self._run_on(cache, cache is not None and P > 0, ids=ids, position_ids=positions, attention_mask=mask)
        results, r = [], 0
        for (prefix, rows), t, n in zip(requests, lengths, sizes):
            def grown(b: int, m: int, prefix=prefix, rows=rows, t=t, r=r) -> Prefix:
                if self.lm.recurrent:
                    return self._grown(prefix, rows[b, :m].to(dev))
                new_ids = torch.cat([prefix.ids, rows[b, :m].to(dev)])
                if cache is None or len(new_ids) == 0:
                    return Prefix(new_ids, None)
                return Prefix(new_ids, make=lambda: _select(cache, r + b, [(0, t), (P, m)]))
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


PASS_TOKENS = 32  # what one more forward pass costs, in tokens: reading the weights once (SmolLM2 layer 15
#                  on this 2-core CPU: ~30 ms a pass, ~1 ms a token of a lock-step batch)
ATTENTION = 2.5  # what a (query, key) pair costs, in tokens × block parameters ÷ query width: SmolLM2
#                  layer 15, 32 requests of 288 tokens with 10 or 40 cached keys each, passed flat
#                  (every token against every key): 46 and 179 ms more than padded, ~0.4 µs a pair
FLAT_KEYS = 4096  # keys of a flat pass at most (its mask and attention scores are [N, keys])
COPY = 100.0  # what one cached position copied into one row costs, in tokens × block parameters ÷ the keys' and
#               values' width: a padded pass gives every row its own copy of its prefix's cache (the cache
#               concatenates), a flat pass each prefix once. SmolLM2 layers 1 / 15 / 30 and Gemma-3-270M layer 9,
#               passes of 128 rows or more after 200-600 tokens: 92-175 (smaller ones at layer 1 too fast to read;
#               docs/results/invert/flat_passes.py, its runs flat_passes-4c937e0-*.txt)


def attention_shape(lm) -> tuple[int, int, int]:
    """(query heads, key-value heads, head width) of lm's attention."""
    heads = lm.config_value("num_attention_heads")
    return heads, lm.config_value("num_key_value_heads", heads), \
        lm.config_value("head_dim") or lm.config_value("hidden_size") // heads


def pass_costs(lm) -> tuple[float, float]:
    """`pack`'s costs in tokens: a (query, key) pair's, ATTENTION × query width ÷ block parameters (SmolLM2:
    4e-4; a 1.5B model's wider blocks make it 8e-5), and a cached position copied into one row's, COPY ×
    the keys' and values' width ÷ block parameters (SmolLM2: 0.011)."""
    heads, kv_heads, head_dim = attention_shape(lm)
    params = sum(p.numel() for p in lm.blocks[0].parameters())
    return ATTENTION * heads * head_dim / params, COPY * 2 * kv_heads * head_dim / params


def pack(shapes: list[tuple[int, int, int]], max_tokens: int, attention: float, copy: float = 0.0,
         flat: bool = True) -> list[tuple[list[int], bool]]:
    """Cut requests of (prefix length t_i, rows n_i, row length k_i), longest rows first, into consecutive
    passes, each padded (rows to the first k, caches to the longest prefix P: Σ n·k_first tokens, each
    against P + k_first keys, Σ n rows of P cached positions copied) or, where `flat`, flat (the N = Σ n·k
    tokens in one row, each against all S + N keys, S = Σ t cached positions copied: an upper bound, as a
    flat pass holds a prefix shared by requests once): the cut and layouts of least
    Σ PASS_TOKENS + tokens + attention × pairs + copy × copied positions (dynamic programming over the cut
    points), a pass at most max_tokens tokens unless it is one request (alone: padded, or flat if it has
    several rows and fits max_tokens). -> (indices, flat?) per pass. (Lock-step rounds after the first carry
    rows of many lengths on prefixes of many lengths: padding them cost SmolLM2 layer 15 three passes of
    360 tokens for 290; the first round, 32 rows of 20 on empty prefixes, is cheapest padded; one prompt's
    candidates after a long prefix are cheapest flat.)"""
    n = len(shapes)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j requests
    cut, layout = [0] * (n + 1), [False] * (n + 1)
    for j in range(1, n + 1):
        rows = tokens = keys = longest = 0
        for i in range(j - 1, -1, -1):  # the last pass holds requests i..j-1
            t, m, k = shapes[i]
            rows, tokens, keys, longest = rows + m, tokens + m * k, keys + t, max(longest, t)
            padded = rows * k  # rows padded to k_i, the pass's longest
            if min(padded, tokens) > max_tokens and i < j - 1:
                break
            costs = []
            if padded <= max_tokens or i == j - 1:
                costs.append((PASS_TOKENS + padded + attention * padded * (longest + k) + copy * rows * longest, False))
            if flat and (i < j - 1 or m > 1) and tokens <= max_tokens and keys + tokens <= FLAT_KEYS:
                costs.append((PASS_TOKENS + tokens + attention * tokens * (keys + tokens) + copy * keys, True))
            for c, is_flat in costs:
                if best[i] + c < best[j]:
                    best[j], cut[j], layout[j] = best[i] + c, i, is_flat
    parts, j = [], n
    while j > 0:
        parts.append((list(range(cut[j], j)), layout[j]))
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
    cache = lm.new_cache(max(t.blocks_read for t in taps)) if any(t.needs_cache for t in taps) else None
    states = dict(zip(layers, run_layers(lm, layers, ids=ids.to(lm.device), cache=cache)))
    dtype = taps[0].lm.dtype  # `lm` may be a lower-precision copy of the taps' LM (LM.copy_in)
    states = {layer: h.to(dtype) for layer, h in states.items()}
    return [t.from_pass(states, cache) for t in taps]
