"""Observation surfaces: what leaked, as a function g of the layer states, computed for any candidate.

A surface is a *tap* (LayerTap's interface: `states`, `prefill`, `extend`, ... return observations
[B, T, dim] instead of states [B, T, d]) plus `dim` (size of one observed vector), `key` (a
string naming what is observed, the cache key of anything fitted on it) and `blocks_read` (the
blocks its observations depend on: the weights part of that key, LayerTap's for every surface
here). SipIt compares a candidate's observation with the leaked one exactly as it compares states; it never learns which
surface it runs on.

- LayerTap:     the states themselves (g = identity), optionally after the final norm (tap.py).
- KVTap:        block ℓ's KV cache as HF stores it (keys after rotary, values; GQA heads), computed
                by stopping the forward right after block ℓ's attention wrote its cache: blocks
                above ℓ and block ℓ's MLP never run.
- ProjectedTap: states @ Pᵀ for a known projection P [k, d].
- SAETap:       an SAE's latents of the states, compared through its reconstruction decode(encode(h)) [d] (sae.py).
- SortedTap:    each state's coordinates in ascending order: what states whose hidden dimensions went
                through an unknown permutation (the same for every position) still determine.
- logits:       logits = softcap(W·norm(h_L) + b) with W [V, d] of full column rank determine
                norm(h_L); `normed_states_from_logits` recovers them once per file (least squares in
                float64) and the surface is LayerTap(L, final_norm=True) with its own ε.
"""
from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from .load import LM, ModelError
from .lm import attention_module, reads_earlier_kv
from .tap import LayerTap, _Stop, position0_tables

KV_PARTS = ("keys", "values", "both")


class ProjectedTap(LayerTap):
    """states @ Pᵀ: observations [B, T, k] for a known projection P [k, d]."""

    plain_states = False

    def __init__(self, lm: LM, layer: int, projection: Tensor, final_norm: bool = False):
        super().__init__(lm, layer, final_norm)
        if projection.dim() != 2 or projection.shape[1] != lm.d_model:
            raise ModelError(f"projection must be [k, d={lm.d_model}] for {lm.name}, got {list(projection.shape)}")
        self.projection = projection.to(device=lm.device, dtype=lm.dtype)

    @property
    def dim(self) -> int:
        return self.projection.shape[0]

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.projection.float().cpu().contiguous().numpy().tobytes()).hexdigest()[:12]
        return f"projection:{self.dim}x{self.lm.d_model}:{digest}:L{self.layer}" + ("n" if self.final_norm else "")

    def _run(self, **kw) -> Tensor:
        return super()._run(**kw) @ self.projection.T

    def from_pass(self, states, cache) -> Tensor:
        return super().from_pass(states, cache) @ self.projection.T


class SAETap(LayerTap):
    """decode(encode(h)): the reconstruction [B, T, d] of the states' latents by a known SAE (models/sae.py), what a
    leak of the latents f is compared through once decoded (decode(f)). float32, the SAE's dtype. The states are
    centred first for an SAE trained on TransformerLens' centred stream of a model of LayerNorm blocks."""

    plain_states = False

    def __init__(self, lm: LM, layer: int, sae, final_norm: bool = False):
        super().__init__(lm, layer, final_norm)
        if sae.d != lm.d_model:
            raise ModelError(f"the SAE reads {sae.d} dimensions, {lm.name}'s states have {lm.d_model}: another model's SAE")
        if sae.layer is not None and sae.layer != self.layer:
            raise ModelError(f"the SAE reads layer {sae.layer} ({sae.hook_name}), not layer {self.layer}")
        self.sae = sae.to(lm.device)
        self.centre = sae.centred_on_layernorm and any(isinstance(m, torch.nn.LayerNorm) for m in lm.blocks[0].modules())
        self._digest = sae.digest

    @property
    def key(self) -> str:
        return f"sae:{self.sae.n}:{self._digest}:L{self.layer}" + ("c" if self.centre else "") + \
            ("n" if self.final_norm else "")

    def latents(self, h: Tensor) -> Tensor:
        """The SAE's latents [..., n] of states h [..., d], as its training saw them."""
        return self.sae.encode(h - h.mean(-1, keepdim=True) if self.centre else h)

    def _run(self, **kw) -> Tensor:
        return self.sae.decode(self.latents(super()._run(**kw)))

    def from_pass(self, states, cache) -> Tensor:
        return self.sae.decode(self.latents(super().from_pass(states, cache)))


class SortedTap(LayerTap):
    """sort(h): the state's d coordinates in ascending order, [B, T, d].

    States leaked with their hidden dimensions permuted by an unknown π (Hidden No More's setting)
    are compared through what π cannot change: sort(h ∘ π) = sort(h). Sorting is 1-Lipschitz in
    the L2 norm (‖sort(a) − sort(b)‖ ≤ ‖a − b‖), so the true token's distance stays within the
    states' ε; a wrong token passes only if its state is a near-permutation of the observed one.
    Weaker than knowing π is shared by all positions, and needs no π."""

    plain_states = False

    @property
    def key(self) -> str:
        return "sorted:" + super().key

    def _run(self, **kw) -> Tensor:
        return super()._run(**kw).sort(-1).values

    def from_pass(self, states, cache) -> Tensor:
        return super().from_pass(states, cache).sort(-1).values


@torch.no_grad()
def recover_permutation(tap: LayerTap, observed: list[Tensor]) -> Tensor | None:
    """The hidden-dimension permutation of permuted states, from the first position of every prompt,
    or None where those positions do not pin it. observed: per prompt [T_i, d] = states[:, π].

    Position 0 depends on its token only: the token whose sorted position-0 state is closest to the
    sorted observation is found among all V (one forward of the vocabulary through the tap's
    blocks), and its unsorted state says where each observed coordinate came from. Coordinates are
    matched greedily on their values across the prompts ([d, B] features); the match is kept only
    if every coordinate's runner-up is ≥ 10× farther than the worst accepted match (near-equal
    values — few prompts, coarse storage — can leave pairs open: then None, and SortedTap compares
    without π). One 20-token prompt pinned SmolLM2's π at layer 15; int8-row storage did not on a
    tiny model.
    -> perm [d] with observed[..., i] == states[..., perm[i]], or None."""
    first = torch.stack([o[0] for o in observed]).float().cpu()  # [B, d]
    table = position0_tables(lambda ids: [tap.states(ids)], tap.lm.vocab_size, tap.lm.device,
                             desc="permutation")[0].cpu()  # [V, d]
    x0 = table[torch.cdist(first.sort(-1).values, table.sort(-1).values).argmin(1)]  # [B, d]: each first token's state
    cost = torch.cdist(first.T.double(), x0.T.double())  # [d, d]: observed coordinate i vs state coordinate j
    perm = torch.full((cost.shape[0],), -1, dtype=torch.long)
    used = torch.zeros(cost.shape[1], dtype=torch.bool)
    left = cost.shape[0]
    for flat in cost.flatten().argsort().tolist():  # greedy: closest pairs first
        i, j = divmod(flat, cost.shape[1])
        if perm[i] < 0 and not used[j]:
            perm[i], used[j], left = j, True, left - 1
            if left == 0:
                break
    matched = cost.gather(1, perm[:, None])[:, 0]
    runner_up = cost.scatter(1, perm[:, None], float("inf")).min(1).values
    worst = float(matched.max()) + 1e-12 * float(first.abs().max())
    return perm if bool((runner_up > 10 * worst).all()) else None


class KVTap(LayerTap):
    """Block ℓ's KV cache (HF `past_key_values.layers[ℓ-1]`): keys after rotary, values, or both.

    Observation of one position: the n_kv_heads × head_dim keys (and/or values) flattened, keys
    first: [B, T, dim], dim = n_kv_heads·head_dim (×2 for both, where keys and values are alike: `shapes`).
    Rotary keys are compared at equal positions, so no un-rotation is needed to verify. The tap's prefix
    cache covers blocks 1..ℓ.
    """

    plain_states = False
    needs_cache = True

    def __init__(self, lm: LM, layer: int, part: str = "both"):
        super().__init__(lm, layer, final_norm=False)
        if self.layer == 0:
            raise ModelError("the KV surface needs a block: layer ℓ ≥ 1 means block ℓ's cache (HF layers[ℓ-1])")
        if part not in KV_PARTS:
            raise ModelError(f"KV part must be one of {', '.join(KV_PARTS)}, got {part!r}")
        if reads_earlier_kv(lm, self.layer - 1):
            raise ModelError(f"{lm.name}: block {self.layer - 1} (0-based) keeps no KV cache of its own (it reads "
                             "an earlier block's: Gemma-3n's and Gemma-4's KV sharing), so layer "
                             f"{self.layer} has no KV surface: choose a lower layer")
        self.part = part
        self._shapes: dict[str, tuple[int, int]] | None = None

    def __repr__(self):
        return f"KVTap({self.lm.name}, layer={self.layer}, part={self.part})"

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        """{"keys": (n_kv_heads, head_dim), "values": (...)} of block ℓ's cache, read off one 1-token forward (they
        differ where attention caches a latent: DeepSeek-V3's compressed KV as keys, its rotary key part as values)."""
        if self._shapes is None:
            k, v = self.cache_of(torch.zeros(1, 1, dtype=torch.long, device=self.lm.device))
            self._shapes = {"keys": (k.shape[1], k.shape[3]), "values": (v.shape[1], v.shape[3])}
        return self._shapes

    @property
    def heads(self) -> tuple[int, int]:
        """(n_kv_heads, head_dim) of the first part observed (keys, unless only values): a file's must match."""
        return self.shapes["values" if self.part == "values" else "keys"]

    @property
    def dim(self) -> int:
        return sum(n * hd for part, (n, hd) in self.shapes.items() if self.part in (part, "both"))

    @property
    def key(self) -> str:
        return f"kv:{self.part}:L{self.layer}"

    @torch.no_grad()
    def cache_of(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Block ℓ's keys and values [B, n_kv_heads, T, head_dim] of a full forward of ids [B, T]."""
        cache = self.lm.new_cache(self.blocks_read)
        self._forward(ids=ids, cache=cache)
        layer = cache.layers[self.layer - 1]
        return layer.keys, layer.values

    def _forward(self, cache, **inputs) -> None:
        def stop(module, args, out):
            raise _Stop

        handle = attention_module(self.lm, self.layer - 1).register_forward_hook(stop)
        try:
            self.lm.run_base(cache, input_ids=inputs.get("ids"), inputs_embeds=inputs.get("embeds"),
                             position_ids=inputs.get("position_ids"), attention_mask=inputs.get("attention_mask"))
        except _Stop:
            pass
        finally:
            handle.remove()

    def _run(self, cache=None, **inputs) -> Tensor:
        n = (inputs["ids"] if inputs.get("ids") is not None else inputs["embeds"]).shape[1]
        cache = cache if cache is not None else self.lm.new_cache(self.blocks_read)
        self._forward(cache, **inputs)
        layer = cache.layers[self.layer - 1]
        return kv_observation(layer.keys[:, :, -n:], layer.values[:, :, -n:], self.part)

    def from_pass(self, states, cache) -> Tensor:
        layer = cache.layers[self.layer - 1]
        return kv_observation(layer.keys, layer.values, self.part)

    def extend_layers(self, prefix, ids, layers):
        raise NotImplementedError("KVTap observes one block's cache, not states at several layers")


def kv_observation(keys: Tensor | None, values: Tensor | None, part: str) -> Tensor:
    """keys/values [B, H, T, hd] (HF cache layout) -> observation [B, T, H·hd] (both: keys then values)."""
    def flat(x: Tensor) -> Tensor:
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)

    if part == "keys":
        return flat(keys)
    if part == "values":
        return flat(values)
    return torch.cat([flat(keys), flat(values)], -1)


# -- logits -------------------------------------------------------------------------------------


def logit_softcap(lm: LM) -> float | None:
    """Gemma-2/3's final soft-capping: logits = cap·tanh(z / cap); None when the model has none."""
    cap = lm.config_value("final_logit_softcapping")
    return float(cap) if cap else None


def logits_tap(lm: LM) -> LayerTap:
    """The tap a logits surface is compared through: the final-normed states at layer L (a load cut
    below L raises ModelError: its last loaded block is not the one the LM head reads)."""
    return LayerTap(lm, lm.layer_index(-1), final_norm=True)


@torch.no_grad()
def normed_states_from_logits(lm: LM, logits: Tensor, logprobs: bool = False) -> Tensor:
    """Recover norm(h_L) [T, d] from the logits (or log-softmax) [T, V] of every position.

    Undoes soft-capping (atanh) and the head's bias, then solves W x = z by least squares in
    float64 (W [V, d] must have full column rank: V ≥ d). Log-probabilities are z minus an unknown
    per-position constant: centring both sides over the vocabulary removes it. Exact up to the
    rounding of the file amplified by W's conditioning (see `logits_error`).
    """
    V = lm.model.get_output_embeddings().weight.shape[0]
    if logits.shape[-1] != V:
        raise ModelError(f"logits have {logits.shape[-1]} entries per position, the model's head has {V}: a "
                         "truncated vocabulary or top-k logits cannot be inverted exactly (all V logits needed)")
    head = lm.model.get_output_embeddings()
    W = head.weight.double().cpu()  # [V, d]
    z = logits.double().cpu()
    cap = logit_softcap(lm)
    if cap is not None:
        if (z.abs() >= cap).any():
            raise ModelError(f"logits reach the soft-cap ±{cap}: tanh is saturated, the pre-cap logits are lost")
        z = cap * torch.atanh(z / cap)
    if getattr(head, "bias", None) is not None:
        z = z - head.bias.double().cpu()
    if logprobs:
        W, z = W - W.mean(0), z - z.mean(-1, keepdim=True)
    gram = W.T @ W
    x = torch.linalg.solve(gram, W.T @ z.T).T  # [T, d]
    return x.to(device=lm.device, dtype=lm.dtype)


def logits_error(lm: LM, file_error: float) -> float:
    """Relative error of states recovered from logits whose relative rounding is `file_error` (a
    dtype's unit roundoff, or a storage format's bound): that error amplified by cond(W) (a
    least-squares solution moves by ≤ cond(W)·error relatively). Added to the measured ε."""
    s = torch.linalg.svdvals(lm.model.get_output_embeddings().weight.double().cpu())
    return float(s[0] / s[-1]) * file_error


def random_projection(d: int, k: int, kind: str = "gaussian", seed: int = 0, states: Tensor | None = None) -> Tensor:
    """A projection [k, d]: gaussian (N(0, 1/k) entries), coords (k distinct coordinates, seeded), or
    pca (top-k principal directions of `states` [N, d], which must be given)."""
    if not 1 <= k <= d:
        raise ModelError(f"projection size k={k} must be in 1..d={d}")
    gen = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        return torch.randn(k, d, generator=gen) / k ** 0.5
    if kind == "coords":
        return torch.eye(d)[torch.randperm(d, generator=gen)[:k].sort().values]
    if kind == "pca":
        if states is None:
            raise ModelError("a PCA projection needs states to fit on")
        x = states.double().reshape(-1, d)
        _, _, vh = torch.linalg.svd(x - x.mean(0), full_matrices=False)
        if vh.shape[0] < k:
            raise ModelError(f"PCA on {x.shape[0]} states gives at most {vh.shape[0]} directions, asked for {k}")
        return vh[:k].float()
    raise ModelError(f"projection kind must be gaussian, coords or pca, got {kind!r}")
