"""What leaks, per surface, as the audit attacks, perturbs and measures it (issue 16's surfaces).

    spec = parse_surface(lm, "kv:keys", layers)          # bad options: one SipitError, before any work
    s = make_surface(lm, spec, layer=2, prompts=prompts)
    leaked = s.leak(ids)                  # [T, n] what the system stores or sends
    stored = s.defend(defense, leaked)    # the defence applied to it
    s.observe(stored)                     # [T, s.tap.dim] what SipIt and robust.py compare through s.tap

states              the residual stream after block ℓ (LayerTap).
kv[:keys|values|both]  block ℓ's KV cache as HF stores it (KVTap: keys after rotary, GQA heads, one row
                    of n_kv_heads·head_dim per position); with both, keys and values are defended
                    separately (each has its own scale).
logits              every position's logits z [T, V] (layer L). With W = QR (W [V, d] the head, Q [V, d]
                    orthonormal columns) the tap observes y = R·norm(h_L) = Qᵀ(z − b): ‖y − y'‖ is the
                    distance of the two logit vectors, so noise on all V logits, margins, radii and
                    collisions are exact logit-space numbers computed with d numbers per position.
projection:k[:kind] states @ Pᵀ with a known P [k, d] (gaussian, coords, or pca fitted on the attacked
                    prompts' states at ℓ) through ProjectedTap.
sae:DIR             an SAE's latents [T, n] of the states at the layer its hook reads (models/sae.py), compared
                    through its reconstruction (SAETap); defended by storage formats only (dense noise on sparse
                    latents is not a defence modelled here), and the model never reads them (no utility cost).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..capture import SurfaceSpec
from ..invert.robust import add_noise
from ..io import SipitError
from ..models import LM, LayerTap
from ..models.edit import edit_kv, edit_layer
from ..models.sae import load_sae
from ..models.surfaces import KVTap, ProjectedTap, SAETap, logit_softcap, random_projection
from .defenses import Defense, projection, quant_elementwise_bound, quant_error_bound

SURFACES = ("states", "kv", "logits", "projection", "sae")
SURFACES_HELP = "states | kv[:keys|values|both] | logits | projection:K[:gaussian|pca|coords] | sae:DIR"

LEAKS = dict(states="the residual stream after block {layer} (every position)",
             kv="block {layer}'s KV cache ({part}, HF past_key_values.layers[{layer} - 1], keys after rotary)",
             logits="the logits of every position (all V entries)",
             projection="the states after block {layer} projected to {k} dimensions ({projection} P, known to the "
                        "attacker)",
             sae="the latents of the SAE in {sae} ({n} latents, {architecture}) of the states after block {layer} "
                 "(compared through its reconstruction: margins and ρ are of the reconstruction)")
UTILITY = dict(states="the defence applied to the residual stream at that layer, the forward pass continued",
               kv="the defence applied to block ℓ's new keys/values (what the cache stores and attention reads), "
                  "the forward pass continued",
               logits="the defence applied to the logits themselves (next-token cross-entropy of the defended "
                      "logits)",
               projection="not measured: a projection of stored states is not a forward-pass intervention (the "
                          "model never reads it)",
               sae="not measured: the model never reads an SAE's latents (a defence on stored latents costs it "
                   "nothing)")


def parse_surface(lm: LM, text: str, layers: list[int]) -> SurfaceSpec:
    """--surface checked against the model and the audited layers. Raises SipitError."""
    kind = text.split(":")[0]
    if kind not in SURFACES:
        raise SipitError(f"unknown surface {text!r}: use {SURFACES_HELP}")
    spec = SurfaceSpec.parse(text)
    if spec.kind == "kv" and 0 in layers:
        raise SipitError("the kv surface has no layer 0: layer ℓ ≥ 1 means block ℓ's cache (HF layers[ℓ-1])")
    if spec.kind == "logits" and layers != [lm.layer_index(-1)]:
        raise SipitError(f"the logits surface is at the last layer only: use --layers default or {lm.depth}")
    if spec.kind == "projection" and spec.k > lm.d_model:
        raise SipitError(f"surface {text!r}: k={spec.k} exceeds the model's d_model={lm.d_model}")
    return spec


def spec_name(spec: SurfaceSpec) -> str:
    """The canonical name: states, kv:both, logits, projection:16:gaussian, sae:DIRNAME."""
    return {"kv": f"kv:{spec.part}", "projection": f"projection:{spec.k}:{spec.projection}",
            "sae": f"sae:{Path(spec.sae).name}"}.get(spec.kind, spec.kind)


@dataclass
class Surface:
    """One (surface, layer) of an audit: what leaks, and the tap that compares it."""

    name: str
    kind: str  # one of SURFACES
    lm: LM
    tap: LayerTap  # any tap; its observation space is where noise, margins and collisions are measured
    leaks: str  # what leaks, in words
    parts: int = 1  # kv both: keys and values, defended separately
    Q: Tensor | None = None  # logits: [V, d] float64, orthonormal columns, W = QR
    bias: Tensor | None = None  # logits: the head's bias [V] float64, or None

    @property
    def layer(self) -> int:
        return self.tap.layer

    @property
    def input_layer(self) -> int:
        """The layer whose states determine the observation: block ℓ's cache is a function of the
        states at ℓ − 1 (at ℓ = 1 of each token alone: equal last tokens collide by construction)."""
        return self.layer - 1 if self.kind == "kv" else self.layer

    @property
    def utility_note(self) -> str:
        return UTILITY[self.kind]

    @torch.no_grad()
    def leak(self, ids: list[int]) -> Tensor:
        """ids [T] -> what leaks [T, n] (logits: [T, V] as model(ids).logits)."""
        x = torch.tensor(ids, device=self.lm.device)
        if self.kind == "sae":
            return self.tap.latents(LayerTap(self.lm, self.layer).states(x))
        return self.lm.logits(x[None])[0] if self.kind == "logits" else self.tap.states(x)

    def defend(self, defense: Defense, leaked: Tensor, seed: int = 0) -> Tensor:
        """The defence on leaked [..., T, n], each part separately -> what is stored or sent."""
        parts = leaked.chunk(self.parts, -1)
        return torch.cat([defense.observe(x, seed + i) for i, x in enumerate(parts)], -1)

    def observe(self, stored: Tensor) -> Tensor:
        """What leaked [..., T, n] -> the tap's observation [..., T, tap.dim] (identity but for logits and SAEs)."""
        if self.kind == "sae":
            return self.tap.sae.decode(stored)
        if self.kind != "logits":
            return stored
        z = stored.double().cpu() - (0 if self.bias is None else self.bias)
        return (z @ self.Q).to(device=stored.device, dtype=self.lm.dtype)

    def error_bound(self, stored: Tensor, fmt: str) -> Tensor:
        """Worst-case relative error of observe(stored) [T, n] in the tap's space, per position -> [T]:
        the format's bound per part (the max bounds the whole row); for logits the error ‖z − z̃‖ ≤
        bound·‖z̃‖ of the stored logits, which Qᵀ cannot enlarge, relative to ‖ỹ‖; for an SAE's latents, the
        format's elementwise bound through the decoder (SAE.reconstruction_error)."""
        if self.kind == "sae":
            return self.tap.sae.reconstruction_error(stored, quant_elementwise_bound(stored, fmt))
        bound = torch.stack([quant_error_bound(x, fmt) for x in stored.chunk(self.parts, -1)]).amax(0).cpu()
        if self.kind == "logits":
            bound = bound * stored.double().norm(dim=-1).cpu() / self.observe(stored).double().norm(dim=-1).cpu()
        return bound

    def noise(self, clean: Tensor, sigma: float, generator: torch.Generator | None = None) -> Tensor:
        """robust.py's noise for this surface: clean tap observations [..., T, dim] -> noisy ones, the
        noise of norm σ‖·‖ drawn on what leaks (per part; logits: on the V logits)."""
        if self.kind == "logits":
            b = 0 if self.bias is None else self.bias.to(clean.device)
            Q = self.Q.to(clean.device)
            z = clean.double() @ Q.T + b
            return ((add_noise(z, sigma, generator) - b) @ Q).to(clean.dtype)
        return torch.cat([add_noise(x, sigma, generator) for x in clean.chunk(self.parts, -1)], -1)

    def tap_for(self, defense: Defense, seed: int = 0):
        """The tap the attack compares through: project:k observes the states through its own P."""
        if defense.family == "project":
            return ProjectedTap(self.lm, self.layer, projection(self.lm.d_model, defense.param, seed))
        return self.tap

    def edit(self, defense: Defense, seed: int = 0):
        """A context manager applying the defence inside the forward pass (states: the residual at ℓ;
        kv: block ℓ's keys/values). logits and projection are not edited in the forward pass."""
        if self.kind == "states":
            return edit_layer(self.lm, self.layer, lambda h: defense.residual(h, seed))
        if self.kind != "kv":
            return nullcontext()
        part = self.tap.part

        def rows(x: Tensor, i: int) -> Tensor:  # [B, H, T, hd] defended as rows [B, T, H·hd], like the leak
            B, H, T, hd = x.shape
            flat = defense.observe(x.transpose(1, 2).reshape(B, T, H * hd), seed + i)
            return flat.reshape(B, T, H, hd).transpose(1, 2)

        return edit_kv(self.lm, self.layer, lambda k, v: (rows(k, 0) if part != "values" else k,
                                                          rows(v, int(part == "both")) if part != "keys" else v))


def make_surface(lm: LM, spec: SurfaceSpec, layer: int, prompts: list[list[int]], seed: int = 0) -> Surface:
    """The Surface of a parsed spec at `layer` (pca projections are fitted on the prompts' states)."""
    name = spec_name(spec)
    if spec.kind == "kv":
        return Surface(name, "kv", lm, KVTap(lm, layer, spec.part), LEAKS["kv"].format(layer=layer, part=spec.part),
                       parts=2 if spec.part == "both" else 1)
    if spec.kind == "projection":
        base = LayerTap(lm, layer)
        states = torch.cat([base.states(torch.tensor(p, device=lm.device)).cpu() for p in prompts]) \
            if spec.projection == "pca" else None
        P = random_projection(lm.d_model, spec.k, spec.projection, seed, states)
        return Surface(name, "projection", lm, ProjectedTap(lm, layer, P),
                       LEAKS["projection"].format(layer=layer, k=spec.k, projection=spec.projection))
    if spec.kind == "logits":
        head = lm.model.get_output_embeddings()
        Q, R = torch.linalg.qr(head.weight.double().cpu())  # [V, d], [d, d]
        bias = None if getattr(head, "bias", None) is None else head.bias.double().cpu()
        tap = ProjectedTap(lm, lm.layer_index(-1), R.float(), final_norm=True)
        return Surface(name, "logits", lm, tap, LEAKS["logits"], Q=Q, bias=bias)
    if spec.kind == "sae":
        tap = SAETap(lm, layer, load_sae(spec.sae))
        return Surface(name, "sae", lm, tap, LEAKS["sae"].format(sae=spec.sae, n=tap.sae.n, layer=layer,
                                                                  architecture=tap.sae.architecture))
    return Surface(name, "states", lm, LayerTap(lm, layer), LEAKS["states"].format(layer=layer))


def check_defenses(lm: LM, spec: SurfaceSpec, defenses: list[Defense]) -> None:
    """Defences that do not apply to the surface: one SipitError with the reason."""
    if spec.kind == "sae" and any(d.family == "noise" for d in defenses):
        raise SipitError("noise on an SAE's latents (dense noise on sparse codes) is not a defence this audit models: "
                         "use --defenses none,quant:int8,int4,fp8 (storage formats)")
    if spec.kind != "states" and any(d.family == "project" for d in defenses):
        raise SipitError(f"defence project:k keeps k directions of the residual stream: it applies to --surface "
                         f"states only, not {spec.kind} (for a projection leak use --surface projection:K)")
    cap = logit_softcap(lm) if spec.kind == "logits" else None
    if cap is not None and any(d.family != "none" for d in defenses):
        raise SipitError(f"{lm.name} soft-caps its logits (±{cap:g}): a defence on the capped logits does not map "
                         "linearly back to the states, so its ε and radius are not derived here; use --defenses none")
