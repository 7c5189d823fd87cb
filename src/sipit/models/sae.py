"""Sparse autoencoders (SAEs) on a layer's residual stream, as SAELens and EleutherAI's sparsify save them: what their
latents leak.

Interpretability work stores an SAE's latents of every position (feature dashboards, activation caches). They are a
function of the state, f = σ(W_encᵀ(h − b_dec) + b_enc) with σ one of ReLU (SAELens "standard"), TopK, JumpReLU,
a gated ReLU or sparsify's GroupMax, so SipIt inverts them like any surface (surfaces.SAETap). It compares a candidate with the leak
through the SAE's own reconstruction, decode(f) = f W_dec + b_dec, which lives in the state's d dimensions: the
learned policy then calibrates on [·, d] observations (the latents are 4-64x wider), and decoding is linear and
Lipschitz, so another token whose reconstruction lies farther than ε from the leak's has other latents too.

A directory as `SAE.save_model` writes it (SAELens 3-6): cfg.json (d_in, d_sae, architecture, apply_b_dec_to_input,
normalize_activations, hook_name, k or activation_fn_kwargs.k) and sae_weights.safetensors (W_enc [d, n], b_enc [n],
W_dec [n, d], b_dec [d]; threshold [n] for JumpReLU; b_gate, r_mag, b_mag [n] for gated). The hook names the layer:
blocks.i.hook_resid_pre = layer i, blocks.i.hook_resid_post = layer i + 1 (TransformerLens' names), model.layers.i or
layers.i (a Hugging Face block's output) = layer i + 1. An SAE whose config says its TransformerLens model was loaded
with center_writing_weights (model_from_pretrained_kwargs; SAELens' GPT-2 residual SAEs) read a centred residual stream
where the blocks use LayerNorm: SAETap centres the states for it (SAELens trains on unprocessed models by default).

A directory as sparsify's `SparseCoder.save_to_disk` writes it: cfg.json (d_in, k, activation topk or groupmax,
num_latents) and sae.safetensors (encoder.weight [n, d], encoder.bias [n], W_dec [n, d], b_dec [d]), named after its
hookpoint (layers.i: layer i + 1). Transcoders and skip connections (an output that is not a function of the latents)
are refused.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import torch
from torch import Tensor

from ..io import SipitError

NEEDS = {"standard": (), "topk": (), "jumprelu": ("threshold",), "gated": ("b_gate", "r_mag", "b_mag")}  # SAELens'
#         architectures, and the weights each has beyond W_enc, W_dec, b_dec (b_enc: all but gated)
WEIGHTS, CONFIG, SPARSIFY_WEIGHTS = "sae_weights.safetensors", "cfg.json", "sae.safetensors"
HOOKS = ((r"blocks\.(\d+)\.hook_resid_pre", 0), (r"blocks\.(\d+)\.hook_resid_post", 1),
         (r"(?:model\.)?layers\.(\d+)", 1))  # (hook name, layer = index + offset)


class SAEError(SipitError):
    """An SAE directory sipit cannot use; the message says why."""


@dataclass
class SAE:
    """An SAE's weights (float32) and activation. encode: states [..., d] -> latents [..., n]; decode: back."""

    W_enc: Tensor  # [d, n]
    b_enc: Tensor  # [n]
    W_dec: Tensor  # [n, d]
    b_dec: Tensor  # [d]
    architecture: str = "standard"
    layer: int | None = None  # from the hook name, where it names a residual stream
    k: int | None = None  # topk; groupmax: k groups of n / k latents
    threshold: Tensor | None = None  # jumprelu [n]
    gate: tuple[Tensor, Tensor, Tensor] | None = None  # gated: b_gate, r_mag, b_mag [n]
    apply_b_dec_to_input: bool = True
    rescale_by_decoder_norm: bool = False  # topk: pre-activations scaled by ‖W_dec row‖ (and decode undoes it)
    hook_name: str = ""
    centred_on_layernorm: bool = False  # read a TransformerLens stream: centred where the blocks use LayerNorm

    @property
    def d(self) -> int:
        return self.W_enc.shape[0]

    @property
    def n(self) -> int:
        return self.W_enc.shape[1]

    def to(self, device) -> "SAE":
        def move(t):
            return None if t is None else t.to(device)

        return replace(self, W_enc=move(self.W_enc), b_enc=move(self.b_enc), W_dec=move(self.W_dec),
                       b_dec=move(self.b_dec), threshold=move(self.threshold),
                       gate=None if self.gate is None else tuple(map(move, self.gate)))

    def encode(self, h: Tensor) -> Tensor:
        """States h [..., d] (any float dtype) -> latents [..., n] float32, as SAELens' encode."""
        x = h.float() - (self.b_dec if self.apply_b_dec_to_input else 0)
        if self.architecture == "gated":
            b_gate, r_mag, b_mag = self.gate
            active = (x @ self.W_enc + b_gate) > 0
            return active * torch.relu(x @ (self.W_enc * r_mag.exp()) + b_mag)
        pre = x @ self.W_enc + self.b_enc  # [..., n]
        if self.architecture == "standard":
            return torch.relu(pre)
        if self.architecture == "jumprelu":
            return torch.relu(pre) * (pre > self.threshold)
        if self.architecture == "groupmax":  # (sparsify: the largest of each of k groups of consecutive latents)
            best = torch.relu(pre).unflatten(-1, (self.k, -1)).max(-1)
            group = self.n // self.k * torch.arange(self.k, device=pre.device)
            return torch.zeros_like(pre).scatter_(-1, best.indices + group, best.values)
        if self.rescale_by_decoder_norm:
            pre = pre * self.W_dec.norm(dim=-1)
        top = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter_(-1, top.indices, torch.relu(top.values))

    def decode(self, f: Tensor) -> Tensor:
        """Latents f [..., n] -> the SAE's reconstruction [..., d] float32."""
        f = f.float()
        if self.rescale_by_decoder_norm:
            f = f / self.W_dec.norm(dim=-1)
        return f @ self.W_dec + self.b_dec

    def reconstruction_error(self, stored: Tensor, bound: Tensor, exact_zeros: bool = False) -> Tensor:
        """A bound on ‖decode(f) − decode(f̃)‖ / ‖decode(f̃)‖ per position for latents f stored as f̃ [T, n] within an
        elementwise bound b [T, n] (|f − f̃| ≤ b, a storage format's). The stored nonzero latents S move the reconstruction by at
        most σ_max(W_dec[S])·‖b_S‖. A latent stored as zero may hide one up to b_i (latents are ≥ 0), unless a
        JumpReLU threshold lies above b_i; TopK and GroupMax keep at most k: those add b_i‖w_i‖ each (the largest
        k − |S| of them). exact_zeros: the latents a sparse file lists (b > 0, zero or not) are S, every other is an
        exact zero. -> [T] float64 (relative)"""
        W = (self.W_dec / self.W_dec.norm(dim=-1, keepdim=True) if self.rescale_by_decoder_norm else self.W_dec).double()
        row_norms = W.norm(dim=-1)  # [n]
        out = torch.zeros(len(stored), dtype=torch.float64)
        for t, (f, b) in enumerate(zip(stored.cpu(), bound.double().cpu())):
            S = ((f != 0) | (b > 0) if exact_zeros else f != 0).nonzero()[:, 0]
            if len(S):
                out[t] = torch.linalg.matrix_norm(W[S], ord=2) * b[S].norm()
            if not exact_zeros:
                hidden = b * row_norms * (f == 0)  # [n]
                if self.threshold is not None:
                    hidden = hidden * (b > self.threshold.cpu())
                if self.k is not None:
                    hidden = hidden.topk(max(0, min(self.k - len(S), self.n))).values
                out[t] += hidden.sum()
        return out / self.decode(stored).double().norm(dim=-1).cpu().clamp_min(1e-30)

    @cached_property
    def digest(self) -> str:
        """A fingerprint of the weights and activation (what a file's latents were made with); once per SAE (a wide
        one's weights are gigabytes)."""
        h = hashlib.sha256(repr((self.architecture, self.k, self.apply_b_dec_to_input, self.rescale_by_decoder_norm,
                                 self.centred_on_layernorm)).encode())
        for t in (self.W_enc, self.b_enc, self.W_dec, self.b_dec, self.threshold, *(self.gate or ())):
            if t is not None:
                h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:12]

    def save(self, path: str | Path) -> Path:
        """Write it as SAELens does (cfg.json, sae_weights.safetensors; its architectures: not groupmax)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        weights = dict(W_enc=self.W_enc, b_enc=self.b_enc, W_dec=self.W_dec, b_dec=self.b_dec)
        if self.threshold is not None:
            weights["threshold"] = self.threshold
        if self.gate is not None:
            weights.update(zip(("b_gate", "r_mag", "b_mag"), self.gate))
        save_file({k: v.contiguous() for k, v in weights.items()}, path / WEIGHTS)
        cfg = dict(architecture=self.architecture, d_in=self.d, d_sae=self.n, dtype="float32",
                   apply_b_dec_to_input=self.apply_b_dec_to_input, normalize_activations="none",
                   metadata=dict(hook_name=self.hook_name, sae_lens_version="6.0.0",
                                 model_from_pretrained_kwargs=dict(center_writing_weights=self.centred_on_layernorm)))
        if self.architecture == "topk":
            cfg.update(k=self.k, rescale_acts_by_decoder_norm=self.rescale_by_decoder_norm)
        (path / CONFIG).write_text(json.dumps(cfg, indent=1))
        return path


def hook_layer(hook_name: str) -> int | None:
    """The residual-stream layer a hook name reads (module docstring), or None."""
    for pattern, offset in HOOKS:
        m = re.fullmatch(pattern, hook_name)
        if m:
            return int(m.group(1)) + offset
    return None


def sae_layer(path: str | Path) -> int | None:
    """The layer an SAE directory's hook reads, from its config alone (a wide SAE's weights are gigabytes); an
    unusable directory raises load_sae's SAEError."""
    path = Path(path)
    try:
        if (path / WEIGHTS).is_file():
            return hook_layer(_hook_name(json.loads((path / CONFIG).read_text())))
        if (path / SPARSIFY_WEIGHTS).is_file() and (path / CONFIG).is_file():
            return hook_layer(path.name)
    except (OSError, ValueError, AttributeError):
        pass
    return load_sae(path).layer


def _hook_name(cfg: dict) -> str:
    """A SAELens config's hook: metadata.hook_name (6), hook_name or hook_point (before)."""
    return (cfg.get("metadata") or {}).get("hook_name") or cfg.get("hook_name") or cfg.get("hook_point") or ""


def load_sae(path: str | Path) -> SAE:
    """An SAE from a SAELens or sparsify directory (module docstring). Raises SAEError with one clear message."""
    from safetensors.torch import load_file

    path = Path(path)
    weights = next((path / name for name in (WEIGHTS, SPARSIFY_WEIGHTS) if (path / name).is_file()), None)
    if not (path / CONFIG).is_file() or weights is None:
        raise SAEError(f"{path}: not an SAE directory (SAELens' {CONFIG} and {WEIGHTS}, or sparsify's {CONFIG} and "
                       f"{SPARSIFY_WEIGHTS} expected)")
    try:
        cfg = json.loads((path / CONFIG).read_text())
        w = {n: t.float() for n, t in load_file(weights).items()}
    except Exception as e:  # (json, safetensors: a corrupt file)
        raise SAEError(f"{path}: unreadable SAE: {e}") from e
    if weights.name == SPARSIFY_WEIGHTS:
        return _sparsify(path, cfg, w)
    meta = cfg.get("metadata") or {}
    hook = _hook_name(cfg)
    arch = cfg.get("architecture", "standard")
    kwargs = cfg.get("activation_fn_kwargs") or {}
    if (cfg.get("activation_fn") or cfg.get("activation_fn_str")) == "topk" and arch == "standard":
        arch = "topk"  # (SAELens before 6 saved TopK SAEs as standard ones with a topk activation)
    if arch not in NEEDS:
        raise SAEError(f"{path}: SAE architecture {arch!r} is not supported (supported: {', '.join(NEEDS)})")
    norm = cfg.get("normalize_activations", "none")
    if norm not in ("none", None):
        raise SAEError(f"{path}: normalize_activations={norm!r}: only SAEs that read the states as they are "
                       "(normalize_activations 'none', or a scaling folded into the weights) are supported")
    if cfg.get("reshape_activations", "none") != "none" or cfg.get("hook_head_index") is not None:
        raise SAEError(f"{path}: this SAE reads attention heads ({hook!r}), not a residual stream")
    missing = [n for n in ("W_enc", "W_dec", "b_dec", *(() if arch == "gated" else ("b_enc",)), *NEEDS[arch])
               if n not in w]
    if missing:
        raise SAEError(f"{path}: {WEIGHTS} lacks {', '.join(missing)} (a {arch} SAE)")
    n = _check_shapes(path, w["W_enc"], w["W_dec"], w["b_dec"])
    k = cfg.get("k", kwargs.get("k"))
    if arch == "topk" and not (isinstance(k, int) and 1 <= k <= n):
        raise SAEError(f"{path}: a TopK SAE needs an integer k in 1..{n} in {CONFIG}, got {k!r}")
    loaded = meta.get("model_from_pretrained_kwargs") or cfg.get("model_from_pretrained_kwargs") or {}
    transformer_lens = (meta.get("model_class_name") or cfg.get("model_class_name") or "HookedTransformer") == \
        "HookedTransformer" and hook.startswith("blocks.")
    return SAE(w["W_enc"], w.get("b_enc", torch.zeros(n)), w["W_dec"], w["b_dec"], arch, hook_layer(hook),
               k if arch == "topk" else None, w.get("threshold"),
               tuple(w[x] for x in ("b_gate", "r_mag", "b_mag")) if arch == "gated" else None,
               bool(cfg.get("apply_b_dec_to_input", True)), bool(cfg.get("rescale_acts_by_decoder_norm", False)), hook,
               transformer_lens and bool(loaded.get("center_writing_weights", False)))


def _check_shapes(path: Path, W_enc: Tensor, W_dec: Tensor, b_dec: Tensor) -> int:
    """W_enc [d, n], W_dec [n, d], b_dec [d], or one SAEError. -> n"""
    d, n = W_enc.shape
    if W_dec.shape != (n, d) or b_dec.shape != (d,):
        raise SAEError(f"{path}: W_enc {list(W_enc.shape)}, W_dec {list(W_dec.shape)} and b_dec {list(b_dec.shape)} "
                       "do not fit [d, n], [n, d], [d]")
    return n


def _sparsify(path: Path, cfg: dict, w: dict) -> SAE:
    """A sparsify SparseCoder (module docstring): relu(encoder(h − b_dec)), then its top k (or the largest of each of k
    groups), decoded by W_dec + b_dec."""
    if cfg.get("transcode") or cfg.get("skip_connection") or "W_skip" in w:
        raise SAEError(f"{path}: a transcoder or an SAE with a skip connection: its output is not a function of its "
                       "latents alone")
    missing = [n for n in ("encoder.weight", "encoder.bias", "W_dec", "b_dec") if n not in w]
    if missing:
        raise SAEError(f"{path}: {SPARSIFY_WEIGHTS} lacks {', '.join(missing)} (a sparsify SAE)")
    W_enc = w["encoder.weight"].T.contiguous()  # [d, n]
    n = _check_shapes(path, W_enc, w["W_dec"], w["b_dec"])
    arch, k = cfg.get("activation", "topk"), cfg.get("k")
    if arch not in ("topk", "groupmax") or not (isinstance(k, int) and 1 <= k <= n) or (arch == "groupmax" and n % k):
        raise SAEError(f"{path}: a sparsify SAE needs activation topk or groupmax and an integer k in 1..{n} (groupmax: "
                       f"dividing it) in {CONFIG}, got {arch!r} and {k!r}")
    return SAE(W_enc, w["encoder.bias"], w["W_dec"], w["b_dec"], arch, hook_layer(path.name), k, hook_name=path.name)
