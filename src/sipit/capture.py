"""Capture what a system would leak for some prompts (any surface), and set up inverting such a file.

    capture(lm, prompts, layer)                   states [T_i, d] per prompt (LayerTap)
    capture_surface(lm, prompts, "kv:keys", layer) the surface's batched tensors, computed by plain
                                                  transformers calls (model(ids).logits, its KV cache),
                                                  never by the tap that inverts them
    open_surface(lm, states_file, layer, norm)    -> (tap, observations per prompt, ε or None)
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from .io import SipitError
from .models import LM, LayerTap

SURFACES_HELP = ("states | kv[:keys|values|both] | logits | logprobs | projection:K[:gaussian|pca|coords] | permuted | "
                 "sae:DIR (an SAE's latents: a SAELens or sparsify directory)")


@torch.no_grad()
def capture(lm: LM, prompts: list[list[int]], layer: int, final_norm: bool = False,
            batch_size: int = 16) -> list[Tensor]:
    """States [T_i, d] of each prompt at `layer`, from one ordinary full forward pass per batch.

    Prompts are right-padded within a batch; causal attention makes the real positions exact
    (no position attends to the padding after it), so no attention mask is needed.
    """
    tap = LayerTap(lm, layer, final_norm)
    out: list[Tensor] = []
    for batch, ids in _batches(lm, prompts, batch_size):
        states = tap.states(ids)
        out.extend(states[i, : len(p)].clone() for i, p in enumerate(batch))
    return out


def _batches(lm: LM, prompts: list[list[int]], batch_size: int):
    """(prompts, right-padded ids [B, T_max]) per batch."""
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        ids = torch.zeros(len(batch), max(map(len, batch)), dtype=torch.long, device=lm.device)
        for i, p in enumerate(batch):
            ids[i, : len(p)] = torch.tensor(p)
        yield batch, ids


@dataclass
class SurfaceSpec:
    """A parsed --surface: kind (states|kv|logits|logprobs|projection|permuted|sae), kv part, projection k and kind,
    the SAE's directory."""

    kind: str
    part: str = "both"
    k: int = 0
    projection: str = "gaussian"
    sae: str = ""

    @classmethod
    def parse(cls, text: str) -> "SurfaceSpec":
        kind, *rest = text.split(":")
        try:
            if kind in ("states", "logits", "logprobs", "permuted") and not rest:
                return cls(kind)
            if kind == "kv" and len(rest) <= 1 and (not rest or rest[0] in ("keys", "values", "both")):
                return cls(kind, part=rest[0] if rest else "both")
            if kind == "sae" and rest and ":".join(rest):
                return cls(kind, sae=":".join(rest))
            if kind == "projection" and 1 <= len(rest) <= 2 and (len(rest) == 1 or rest[1] in ("gaussian", "pca", "coords")):
                return cls(kind, k=int(rest[0]), projection=rest[1] if len(rest) == 2 else "gaussian")
        except ValueError:
            pass
        raise SipitError(f"bad --surface {text!r}: use {SURFACES_HELP}")


@torch.no_grad()
def capture_surface(lm: LM, prompts: list[list[int]], spec: SurfaceSpec, layer: int, final_norm: bool = False,
                    seed: int = 0, batch_size: int = 16) -> tuple[dict[str, Tensor], dict]:
    """The surface's tensors for the prompts, batched and zero-padded (states.pad), plus metadata.
    seed: the projection's, or the permutation's (`permuted`: one seeded π of the hidden dimensions
    for every state, not written to the file)."""
    from .models.sae import load_sae
    from .models.surfaces import KVTap, SAETap, random_projection
    from .states import pad

    if spec.kind == "sae":
        sae = load_sae(spec.sae)
        tap = SAETap(lm, layer, sae, final_norm)  # (checks the layer its hook reads)
        latents = [tap.latents(s).cpu() for s in capture(lm, prompts, layer, final_norm, batch_size)]  # [T_i, n]
        m = max(1, max(int((f != 0).sum(-1).max()) for f in latents))  # stored sparse: each position's m largest
        top = [f.abs().topk(m, dim=-1).indices for f in latents]
        return ({"sae_values": pad([f.gather(-1, i) for f, i in zip(latents, top)]), "sae_indices": pad(top).int()},
                {"sae": spec.sae, "sae_digest": sae.digest, "sae_latents": str(sae.n)})
    if spec.kind in ("states", "projection", "permuted"):
        states = capture(lm, prompts, layer, final_norm, batch_size)
        if spec.kind == "states":
            return {"hidden_states": pad(states)}, {}
        if spec.kind == "permuted":
            perm = torch.randperm(lm.d_model, generator=torch.Generator().manual_seed(seed))
            return {"hidden_states": pad([s.cpu()[:, perm] for s in states])}, {}
        P = random_projection(lm.d_model, spec.k, spec.projection, seed, torch.cat(states).cpu())
        return {"projected": pad([s.cpu() @ P.T for s in states]), "projection": P}, {"projection_kind": spec.projection}
    if spec.kind == "kv":
        KVTap(lm, layer, spec.part)  # validates layer and part
    out: dict[str, list[Tensor]] = {}
    for batch, ids in _batches(lm, prompts, batch_size):
        if spec.kind == "kv":
            full = lm.new_cache()
            lm.run_base(full, input_ids=ids)
            cache = full.layers[layer - 1]
            for name, x in (("keys", cache.keys), ("values", cache.values)):
                if spec.part in (name, "both"):
                    out.setdefault(name, []).extend(x[i, :, : len(p)].cpu() for i, p in enumerate(batch))
        else:
            logits = lm.model(input_ids=ids).logits.float()
            logits = torch.log_softmax(logits, -1) if spec.kind == "logprobs" else logits
            out.setdefault(spec.kind, []).extend(logits[i, : len(p)].cpu() for i, p in enumerate(batch))
    time_dim = 1 if spec.kind == "kv" else 0
    return {name: pad(xs, time_dim) for name, xs in out.items()}, ({"part": spec.part} if spec.kind == "kv" else {})


def check_layer(lm: LM, ids: list[int], states: Tensor, layer: int, final_norm: bool, error: float = 0.0) -> None:
    """A file that carries its prompts' ids must match the layer it is inverted at: if the first prompt's states
    match another (layer, final norm) of its own ids and not this one (identify.identify_with_ids: one forward
    pass), one clear SipitError naming that layer — before any calibration (a wrong layer would otherwise fail
    only after the policy is fitted at it)."""
    from .identify import identify_with_ids

    ident = identify_with_ids(lm, ids, states, error)
    asked = next(h for h in ident.hypotheses if (h.layer, h.final_norm) == (layer, final_norm))
    best = ident.best
    if not ident.matching:  # (a wrong layer at the right precision matches: below)
        near = ident.hypotheses[0]
        print(f"sipit: warning: the file's own ids reproduce its states at no layer of {lm.name} in {lm.precision} "
              f"(nearest: {near.name}, scaled distance {near.distance:.2g}; tolerance {ident.tolerance:.2g}): made "
              "at another precision (--precision), by other weights, or at other positions? Its prompts are not "
              "likely to be recovered", file=sys.stderr)
    if best is not None and not asked.matched:
        norm = " --final-norm" if best.final_norm else ""
        raise SipitError(f"these states are {best.name} of {lm.name} for the file's own ids (scaled distance "
                         f"{best.distance:.2g}), not layer {layer}{' with the final norm' if final_norm else ''} "
                         f"({asked.distance:.2g}): give --layer {best.layer}{norm}")


def open_surface(lm: LM, st, layer: int, final_norm: bool, sae: str | None = None):
    """A loaded file (states.States) -> (tap, observations [T_i, tap.dim] per prompt, error).

    error: the relative error the observations carry beyond recomputation (a storage format's
    rounding; for logits, the rounding amplified by the least squares back to states), added to the
    measured ε (InvertConfig.observation_error); 0.0 for plain float observations. sae: an SAE file's SAE
    directory (default: the one its metadata names)."""
    from .invert.verify import UNIT_ROUNDOFF
    from .models import LayerTap
    from .models.surfaces import (KVTap, ProjectedTap, SortedTap, logits_error, logits_tap, normed_states_from_logits,
                                  recover_permutation)

    prompts = [p.to(lm.device) for p in st.prompts]
    if st.surface == "kv":
        tap = KVTap(lm, layer, st.part)
        if tuple(st.kv_heads) != tap.heads:
            raise SipitError(f"the file's {st.part} have {st.kv_heads[0]} heads × {st.kv_heads[1]} per position, block "
                             f"{tap.layer} of {lm.name} caches {tap.heads[0]} × {tap.heads[1]}: wrong model or layout "
                             "(expected HF's [B, n_kv_heads, T, head_dim])")
        return tap, prompts, st.error or 0.0
    if st.surface in ("logits", "logprobs"):
        error = st.error if st.error is not None else UNIT_ROUNDOFF.get(prompts[0].dtype, 2.0 ** -8)
        states = [normed_states_from_logits(lm, p, logprobs=st.surface == "logprobs") for p in prompts]
        return logits_tap(lm), states, logits_error(lm, error)
    if st.surface == "projection":
        return ProjectedTap(lm, layer, st.projection, final_norm), prompts, st.error or 0.0
    if st.surface == "sae":
        return _open_sae(lm, st, layer, final_norm, sae or st.meta.get("sae"), prompts)
    if st.surface == "permuted":
        if prompts[0].shape[-1] != lm.d_model:
            raise SipitError(f"permuted states have {prompts[0].shape[-1]} dimensions per position, {lm.name} has "
                             f"{lm.d_model}: wrong model?")
        start = time.perf_counter()
        perm = recover_permutation(LayerTap(lm, layer, final_norm), prompts)
        if perm is not None:  # undo π: the states themselves, inverted like any states file
            inverse = perm.argsort().to(lm.device)
            print(f"sipit: the hidden-dimension permutation is pinned by the prompts' first positions "
                  f"({time.perf_counter() - start:.1f}s); inverting the unpermuted states", file=sys.stderr)
            return LayerTap(lm, layer, final_norm), [p[:, inverse] for p in prompts], st.error or 0.0
        print("sipit: the prompts' first positions leave the permutation open; comparing sorted states "
              "(exact, slower ranking)", file=sys.stderr)  # sorting keeps a storage bound (1-Lipschitz)
        return SortedTap(lm, layer, final_norm), [p.sort(-1).values for p in prompts], st.error or 0.0
    if st.meta.get("centred") == "true":  # TransformerLens' default processing: compare after centring
        d = lm.d_model
        return ProjectedTap(lm, layer, torch.eye(d) - 1.0 / d, final_norm), prompts, st.error or 0.0
    return LayerTap(lm, layer, final_norm), prompts, st.error or 0.0


def _open_sae(lm: LM, st, layer: int, final_norm: bool, path: str | None, latents: list[Tensor]):
    """open_surface of an SAE's latents [T_i, n] (or their values [T_i, m] at st.sae_indices): the SAETap and the
    latents decoded, [T_i, d]. A storage format's rounding of the latents (st.sae_bounds, elementwise; a float16 or
    bfloat16 file's, relative) moves each reconstruction by at most SAE.reconstruction_error, relative: the error
    added to ε (a sparse file lists every active latent: its absent ones are exact zeros)."""
    from .invert.verify import UNIT_ROUNDOFF
    from .models.sae import load_sae
    from .models.surfaces import SAETap

    if not path:
        raise SipitError("an SAE latents file needs its SAE: give --sae DIR (a SAELens or sparsify directory)")
    sae = load_sae(path)
    dtype = latents[0].dtype
    bounds = st.sae_bounds
    if bounds is None and dtype != torch.float32:  # (a float16 or bfloat16 file without a storage format)
        bounds = [f.abs().float() * UNIT_ROUNDOFF.get(dtype, 2.0 ** -8) for f in latents]
    if st.sae_indices is not None:  # stored sparse: each position's active latents (ids, values), zero-padded
        if max(int(i.max()) for i in st.sae_indices) >= sae.n:
            raise SipitError(f"the file's latent ids reach {max(int(i.max()) for i in st.sae_indices)}, the SAE in "
                             f"{path} has {sae.n} latents")

        def dense(values: list[Tensor]) -> list[Tensor]:
            return [torch.zeros(len(v), sae.n).scatter_add_(1, i, v.float().cpu()) for v, i in zip(values, st.sae_indices)]

        latents, bounds = dense(latents), bounds and dense(bounds)
    if latents[0].shape[-1] != sae.n:
        raise SipitError(f"the file has {latents[0].shape[-1]} latents per position, the SAE in {path} has {sae.n}")
    if st.meta.get("sae_digest") not in (None, sae.digest):
        raise SipitError(f"the file's latents were made by another SAE than the one in {path} (fingerprint "
                         f"{st.meta['sae_digest']}, this one {sae.digest})")
    tap = SAETap(lm, layer, sae, final_norm)
    error = 0.0 if bounds is None else max(
        float(sae.reconstruction_error(f, b, exact_zeros=st.sae_indices is not None).max()) for f, b in zip(latents, bounds))
    return tap, [tap.sae.decode(f.to(lm.device)) for f in latents], error
