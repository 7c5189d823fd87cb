"""Files other tools write, turned into a sipit states file's tensors and metadata.

- transformers `output_hidden_states`: a tuple of L+1 tensors [B, T, d] saved with torch.save (or
  safetensors names hidden_states.0 ... hidden_states.L). Entry i is sipit layer i, except that HF
  applies the final norm to the last entry: layer L from such a tuple is read with final_norm.
- TransformerLens caches (`cache.cache_dict`, .pt or safetensors): blocks.{i}.hook_resid_pre is
  layer i, blocks.{i}.hook_resid_post layer i+1 (ln_final.hook_normalized is not read: fold_ln
  removes the norm's scale from it; use hook_resid_post with --final-norm). With TransformerLens'
  default weight processing (center_writing_weights) every residual
  vector of a LayerNorm model is centred (mean 0 over d); such captures are detected and compared
  after centring (a known projection, capture.open_surface). hook_resid_mid is refused.
- nnsight: `model.model.layers[i].output.save()` is block i's output (a tensor, or a 1-tuple) =
  sipit layer i+1; saved with torch.save it carries no metadata (give --model; --layer, or sipit
  identifies it: identify.py).
- vLLM's `extract_hidden_states` export (ExampleHiddenStatesConnector / OnlineHiddenStatesConnector):
  safetensors with hidden_states [T, n_layers, d] and token_ids [T], one file per request. The
  layers are the run's `eagle_aux_hidden_state_layer_ids`, not stored in the file; id i is the
  residual stream entering (0-based) block i, i.e. sipit layer i.
"""
from __future__ import annotations

import re
from pathlib import Path

from torch import Tensor

from .io import SipitError

TL_HOOK = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|post|mid)$")
HF_TUPLE = re.compile(r"^hidden_states[._](\d+)$")


class ReaderError(SipitError):
    """A file from another tool that says too little (or the wrong thing) to be inverted."""


def foreign(path: Path, tensors: dict[str, Tensor], meta: dict, layer: int | None,
            file_layers: list[int] | None) -> tuple[dict[str, Tensor], dict]:
    """sipit files pass through; other tools' layouts -> ({"hidden_states": ...}, metadata)."""
    if "surface" in meta:
        return tensors, meta
    if any(TL_HOOK.match(k) for k in tensors):
        return _transformer_lens(path, tensors, layer)
    if tensors and all(HF_TUPLE.match(k) for k in tensors):
        return _hf_tuple(path, tensors, layer)
    if vllm_export(tensors):
        return _vllm(path, tensors["hidden_states"], tensors["token_ids"], layer, file_layers)
    return tensors, meta


def vllm_export(tensors: dict[str, Tensor]) -> bool:
    """vLLM's hidden-states export: hidden_states [T, n_layers, d] with its token_ids [T]."""
    hs, tok = tensors.get("hidden_states"), tensors.get("token_ids")
    return hs is not None and tok is not None and hs.dim() == 3 and tok.dim() == 1 and len(tok) == hs.shape[0]


def _pick(path: Path, available: dict[int, tuple[str, bool]], layer: int | None, what: str):
    """available: sipit layer -> (tensor name, final_norm). Returns the entry for `layer`."""
    listing = ", ".join(f"{k}{' (final norm)' if v[1] else ''}" for k, v in sorted(available.items()))
    if layer is None:
        if len(available) == 1:
            layer = next(iter(available))
        else:
            raise ReaderError(f"{path}: {what} holding layers {listing}: give --layer to pick one")
    if layer < 0:
        layer = max(available) + 1 + layer
    if layer not in available:
        raise ReaderError(f"{path}: {what} has no layer {layer} (it holds {listing})")
    return layer, *available[layer]


def _transformer_lens(path: Path, tensors: dict, layer: int | None):
    available: dict[int, tuple[str, bool]] = {}
    mids = []
    for name in tensors:
        m = TL_HOOK.match(name)
        if m and m.group(2) == "mid":
            mids.append(name)
        elif m:
            available[int(m.group(1)) + (m.group(2) == "post")] = (name, False)
    if not available:
        raise ReaderError(f"{path}: TransformerLens cache with only {', '.join(mids[:3])}: the mid-block residual "
                          "is not a layer state; save blocks.{i}.hook_resid_pre or hook_resid_post")
    layer, name, final_norm = _pick(path, available, layer, "TransformerLens cache")
    x = tensors[name]
    meta = dict(layer=str(layer), final_norm=str(final_norm).lower(), surface="states", source="transformer_lens")
    if _centred(x):
        meta["centred"] = "true"
    return {"hidden_states": x}, meta


def _centred(x: Tensor) -> bool:
    """Every vector has mean ≈ 0 over d (TransformerLens' centred residual basis)."""
    x = x.double()
    rms = x.square().mean(-1).sqrt().clamp_min(1e-30)
    return bool((x.mean(-1).abs() <= 1e-5 * rms).all())


def _hf_tuple(path: Path, tensors: dict, layer: int | None):
    entries = {int(HF_TUPLE.match(k).group(1)): k for k in tensors}
    last = max(entries)
    if sorted(entries) != list(range(last + 1)):
        raise ReaderError(f"{path}: hidden_states entries {sorted(entries)} are not 0..{last}: not a whole "
                          "transformers output_hidden_states tuple")
    available = {i: (k, i == last) for i, k in entries.items()}  # HF: the last entry is after the final norm
    layer, name, final_norm = _pick(path, available, layer, "transformers hidden_states tuple")
    meta = dict(layer=str(layer), final_norm=str(final_norm).lower(), surface="states", source="transformers")
    return {"hidden_states": tensors[name]}, meta


def _vllm(path: Path, hs: Tensor, token_ids: Tensor, layer: int | None, file_layers: list[int] | None):
    import json

    n = hs.shape[1]
    if file_layers is None:
        raise ReaderError(f"{path}: vLLM hidden-states export with {n} layer(s) [T, n_layers, d] that does not record "
                          "their ids: give --file-layers ID,... (the run's eagle_aux_hidden_state_layer_ids, in "
                          "order; id i = the input of block i = sipit layer i)")
    if len(file_layers) != n:
        raise ReaderError(f"{path}: --file-layers names {len(file_layers)} layer(s), the file holds {n}")
    available = {lay: (str(i), False) for i, lay in enumerate(file_layers)}
    layer, index, _ = _pick(path, available, layer, "vLLM hidden-states export")
    meta = dict(layer=str(layer), final_norm="false", surface="states", source="vllm",
                ids=json.dumps([token_ids.tolist()]))
    return {"hidden_states": hs[:, int(index)]}, meta
