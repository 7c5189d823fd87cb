"""Observation files: what `sipit capture` writes and `sipit invert` reads.

Format (design.md §2, §7): safetensors with the observation tensor(s) of one surface and string
metadata model, layer, final_norm ("true"/"false"), dtype, precision, tokenizer (fingerprint),
surface, ids (JSON list of id lists, optional ground truth), lengths (JSON list, when prompts in a
batched file have different lengths: positions past a prompt's length are padding).

    surface     tensors                                        observation per position
    states      hidden_states [B, T, d] or [T, d]              the state
    kv          keys and/or values [B, H, T, hd] or [H, T, hd]  (HF cache layout; layer ℓ = block ℓ's
                                                               cache = past_key_values.layers[ℓ-1])
    logits      logits [B, T, V] or [T, V]  (logprobs: log-softmax, surface "logprobs")
    projection  projected [B, T, k] or [T, k] + projection [k, d]  states @ Pᵀ
    permuted    hidden_states [B, T, d] or [T, d], hidden dimensions   the state, π recovered from the
                permuted by one unknown π                      first positions; else sort(state)
    sae         sae_values and sae_indices [B, T, m] (each position's  the SAE's reconstruction of them
                active latents, zero-padded), or dense sae_features
                [B, T, n] (metadata sae: its directory, sae_digest)

Any observation tensor may be stored in low precision (storage.py: metadata `storage`, codes in
NAME, scales in NAME.scale); its ε then comes from the format. `.npy` (no pickles) and `.pt`
(weights_only=True) are read too, and files other tools write (readers.py): transformers
hidden_states tuples, TransformerLens caches, nnsight saves, vLLM hidden-states exports.

A padded batch (a tokenizer's `padding=True`, left or right) is read with its `attention_mask` [B, T]
(beside the observations in the file, or given apart: load_states' `mask`): each row's prompt is its
positions where the mask is 1, and the batch's `input_ids` [B, T], where the file has them, its ids (ground truth,
and a check of the layer and precision: invert/cli.py; without the mask they are not read: a left-padded batch's
padding is then found from its states, States.padding_runs). A file that does not say its model's precision was
computed in its observations' dtype where that is bfloat16 or float16 (computed_in).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from .io import SipitError, atomic_write

PADDING_TENSORS = ("attention_mask", "input_ids")  # a tokenizer's output saved beside a padded batch's states
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SURFACE_TENSORS = {"states": ("hidden_states",), "kv": ("keys", "values"), "logits": ("logits",),
                   "logprobs": ("logprobs",), "projection": ("projected",),
                   "permuted": ("hidden_states",), "sae": ("sae_values", "sae_features")}


class StatesError(SipitError):
    """A states file that cannot be used; the message says what is wrong with it."""


@dataclass
class States:
    """Per-prompt observations of one surface, plus what is known about how they were made."""

    prompts: list[Tensor]  # one [T_i, k] tensor per prompt (k = d for states; see the table above)
    model: str | None = None
    layer: int | None = None
    final_norm: bool = False
    precision: str | None = None
    tokenizer: str | None = None
    ids: list[list[int]] | None = None  # ground truth, when the file has it
    meta: dict = field(default_factory=dict)  # every metadata string, as stored
    surface: str = "states"  # states | kv | logits | logprobs | projection | permuted | sae
    part: str | None = None  # kv: keys | values | both
    kv_heads: tuple[int, int] | None = None  # kv: (n_kv_heads, head_dim) as stored
    projection: Tensor | None = None  # projection: P [k, d]
    sae_indices: list[Tensor] | None = None  # sae, stored sparse: per prompt [T_i, m], the latents of prompts' values
    sae_bounds: list[Tensor] | None = None  # sae in a storage format: elementwise bounds of prompts' values
    error: float | None = None  # relative rounding error of a low-precision storage format (storage.py)
    left_padded: bool = False  # some prompt's row began with padding (its attention_mask): invert/cli.py warns

    @property
    def d_model(self) -> int:
        return self.prompts[0].shape[-1]

    def padding_runs(self) -> list[int]:
        """Per prompt, how many leading positions look like left padding where the file says nothing of padding (a
        batch of several prompts without a mask, lengths or ids); 0 elsewhere. A left-padded row's padding attends to
        nothing, so its every position computes one state, bit for bit, the same in every row: the rows opening with
        two or more identical states give it, and every row opening with it its run of it. Not a proof (a prompt
        opening with one token repeated gives such a run under rotary positions): a row is shown padded only where
        the rest of it is found to be its tokens' alone (invert/cli.py)."""
        if len(self.prompts) < 2 or self.left_padded or "lengths" in self.meta or self.ids:
            return [0] * len(self.prompts)
        runs = [_repeated_start(p) for p in self.prompts]
        pads = [p[0] for p, k in zip(self.prompts, runs) if k > 1]
        return [k if any(torch.equal(p[0], v) for v in pads) else 0 for p, k in zip(self.prompts, runs)]


def save_states(path: str | Path, prompts: list[Tensor], *, model: str, layer: int, final_norm: bool,
                tokenizer: str, precision: str = "fp32", ids: list[list[int]] | None = None) -> Path:
    """Write per-prompt states [T_i, d] as one [B, T_max, d] tensor (zero-padded), atomically."""
    return save_surface(path, {"hidden_states": pad(prompts)}, [len(p) for p in prompts], model=model, layer=layer,
                        final_norm=final_norm, tokenizer=tokenizer, precision=precision, ids=ids)


def pad(prompts: list[Tensor], time_dim: int = 0) -> Tensor:
    """Per-prompt tensors, equal but for the time dim (e.g. [T_i, k]) -> [B, ..., T_max, ...], zero-padded."""
    T = max(p.shape[time_dim] for p in prompts)
    shape = list(prompts[0].shape)
    shape[time_dim] = T
    out = prompts[0].new_zeros(len(prompts), *shape)
    for i, p in enumerate(prompts):
        out[i].narrow(time_dim, 0, p.shape[time_dim]).copy_(p)
    return out


def save_surface(path: str | Path, tensors: dict[str, Tensor], lengths: list[int], *, model: str, layer: int,
                 final_norm: bool, tokenizer: str, precision: str = "fp32", surface: str = "states",
                 ids: list[list[int]] | None = None, storage: str = "fp32", extra_meta: dict | None = None) -> Path:
    """Write one surface's batched tensors (names: SURFACE_TENSORS, plus `projection`) atomically.

    `storage` rounds every observation tensor (not the projection matrix) to that format."""
    from safetensors.torch import save

    from .storage import quantize

    out = {}
    for name, x in tensors.items():
        if name == "projection" or not x.is_floating_point() or (storage == "fp32" and x.dtype != torch.float32):
            out[name] = x.contiguous()
            continue
        q = quantize(x, storage)
        out[name] = q["codes"].contiguous()
        if "scale" in q:
            out[name + ".scale"] = q["scale"].contiguous()
    first = next(out[n] for n in SURFACE_TENSORS[surface] if n in out)
    meta = dict(model=model, layer=str(layer), final_norm=str(final_norm).lower(), surface=surface,
                dtype=str(first.dtype).removeprefix("torch."), precision=precision, tokenizer=tokenizer,
                **(extra_meta or {}))
    if storage != "fp32":
        meta["storage"] = storage
    if len(set(lengths)) > 1:
        meta["lengths"] = json.dumps(lengths)
    if ids is not None:
        meta["ids"] = json.dumps([list(map(int, x)) for x in ids])
    return atomic_write(path, save(out, metadata=meta))


def load_states(path: str | Path, layer: int | None = None, file_layers: list[int] | None = None,
                mask: str | Path | None = None) -> States:
    """Read and validate an observation file. Raises StatesError with one clear message.

    `layer` picks one layer from a file that holds several (a transformers hidden_states tuple, a
    TransformerLens cache, a vLLM export whose layer ids `file_layers` the file does not record).
    `mask`: a file holding the batch's attention_mask [B, T], where the states file has none (read_mask)."""
    from .readers import foreign

    path = Path(path)
    if not path.is_file():
        raise StatesError(f"states file not found: {path}")
    tensors, meta = read_tensors(path)
    padding = {k: tensors.pop(k) for k in PADDING_TENSORS if k in tensors}  # (no reader reads them)
    if mask is not None:
        if "attention_mask" in padding:
            raise StatesError(f"{path} holds its own attention_mask: --attention-mask {mask} is not needed")
        padding["attention_mask"] = read_mask(Path(mask))
    tensors, meta = foreign(path, tensors, meta, layer, file_layers)
    return _validate(path, {**tensors, **padding}, meta)


def read_mask(path: Path) -> Tensor:
    """A batch's attention_mask [B, T] (or [T]) from its own file: the file's one tensor, or the one named
    attention_mask (a tokenizer's whole output saved as a dict)."""
    if not path.is_file():
        raise StatesError(f"attention mask file not found: {path}")
    tensors, _ = read_tensors(path)
    if "attention_mask" in tensors:
        return tensors["attention_mask"]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    raise StatesError(f"{path}: expected one tensor or one named attention_mask, found {', '.join(tensors)}")


def _spans(path: Path, mask: Tensor, B: int, T: int) -> list[tuple[int, int]]:
    """Each row's prompt positions [start, end) from a padded batch's attention_mask [B, T] (1: a prompt's token,
    0: padding); each row's 1s must be one run, as left or right padding leaves them."""
    if mask.dim() == 1:
        mask = mask[None]
    if list(mask.shape) != [B, T]:
        raise StatesError(f"{path}: attention_mask {list(mask.shape)} does not fit the observations' [B, T] = "
                          f"{[B, T]}")
    if mask.is_complex() or not ((mask == 0) | (mask == 1)).all():
        raise StatesError(f"{path}: attention_mask must hold only 0 (padding) and 1 (a prompt's token)")
    spans = []
    for i, row in enumerate(mask.bool()):
        at = row.nonzero()[:, 0]
        if len(at) == 0:
            raise StatesError(f"{path}: attention_mask row {i} is all padding")
        start, end = int(at[0]), int(at[-1]) + 1
        if len(at) != end - start:
            raise StatesError(f"{path}: attention_mask row {i} has padding between its tokens (expected left or "
                              "right padding: one run of 1s)")
        spans.append((start, end))
    return spans


def read_tensors(path: Path) -> tuple[dict[str, Tensor], dict]:
    """A file's tensors and metadata strings as stored (.safetensors, .npy, .pt), before any reader reads them."""
    reader = {".safetensors": _read_safetensors, ".npy": _read_npy, ".pt": _read_pt, ".pth": _read_pt}
    if path.suffix not in reader:
        raise StatesError(f"{path}: unknown states format {path.suffix!r} (use .safetensors, .npy or .pt)")
    return reader[path.suffix](path)


def _read_safetensors(path: Path):
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    except Exception as e:  # safetensors raises SafetensorError / OSError on bad headers and short files
        raise StatesError(f"{path}: not a readable safetensors file (corrupt or truncated?): {e}") from e


def _read_npy(path: Path):
    import numpy as np

    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise StatesError(f"{path}: refusing a pickled .npy file (object arrays are not loaded): {e}") from e
    except Exception as e:
        raise StatesError(f"{path}: not a readable .npy file (corrupt or truncated?): {e}") from e
    return {"hidden_states": torch.from_numpy(np.ascontiguousarray(arr))}, {}


def _read_pt(path: Path):
    """A tensor, a dict of tensors, or a tuple/list of tensors (one: nnsight's saved block output;
    several: a transformers hidden_states tuple, read as hidden_states.0 ... hidden_states.L), also as the
    hidden_states of a dict (beside its batch's attention_mask and input_ids)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise StatesError(f"{path}: cannot load with weights_only=True (arbitrary pickles are refused; "
                          f"save a tensor or {{'hidden_states': tensor}}): {type(e).__name__}: {str(e)[:200]}") from e
    def named(seq) -> dict:  # one tensor: hidden_states; a tuple: hidden_states.0 ... hidden_states.L
        return {"hidden_states": seq[0]} if len(seq) == 1 else {f"hidden_states.{i}": t for i, t in enumerate(seq)}

    if isinstance(obj, (tuple, list)) and obj and all(isinstance(t, Tensor) for t in obj):
        return named(obj), {}
    if isinstance(obj, Tensor):
        return {"hidden_states": obj}, {}
    if isinstance(obj, dict) and isinstance(obj.get("hidden_states"), (tuple, list)):  # {hidden_states: tuple, mask}
        obj = {**{k: v for k, v in obj.items() if k != "hidden_states"}, **named(obj["hidden_states"])}
    if isinstance(obj, dict) and obj and all(isinstance(t, Tensor) for t in obj.values()):
        return dict(obj), {}
    raise StatesError(f"{path}: expected a tensor, a dict of tensors or a tuple of tensors, got {type(obj).__name__}")


def _surface(path: Path, tensors: dict, meta: dict) -> str:
    surface = meta.get("surface")
    if surface is None:
        surface = next((s for s, names in SURFACE_TENSORS.items() if any(n in tensors for n in names)), None)
    if surface is None:
        raise StatesError(f"{path}: no tensor named 'hidden_states' (nor keys/values, logits, logprobs, projected, "
                          "sae_features; "
                          f"found: {', '.join(tensors) or 'none'})")
    if surface not in SURFACE_TENSORS:
        raise StatesError(f"{path}: unknown surface {surface!r} in the metadata (known: {', '.join(SURFACE_TENSORS)})")
    if not any(n in tensors for n in SURFACE_TENSORS[surface]):
        raise StatesError(f"{path}: surface {surface} needs a tensor named {' or '.join(SURFACE_TENSORS[surface])} "
                          f"(found: {', '.join(tensors) or 'none'})")
    return surface


def _stored(path: Path, tensors: dict, name: str, meta: dict, dims: tuple[int, ...], layout: str):
    """One observation tensor, dequantized if stored in low precision -> (x, bound or None), batched."""
    from .storage import dequantize

    x = tensors[name]
    if x.dim() not in dims:
        raise StatesError(f"{path}: {name} must have shape {layout}, got {list(x.shape)}")
    if x.numel() == 0:
        raise StatesError(f"{path}: {name} is empty (shape {list(x.shape)})")
    if "storage" in meta:
        x, bound = dequantize(x, tensors.get(name + ".scale"), meta["storage"])
    elif x.dtype not in FLOAT_DTYPES:
        raise StatesError(f"{path}: {name} must be floating point, got {x.dtype} (low-precision codes need "
                          "metadata 'storage' and their scales)")
    else:
        bound = None
    if x.dim() == min(dims):
        x, bound = x[None], bound[None] if bound is not None else None
    return x, bound


def _observations(path: Path, surface: str, tensors: dict, meta: dict):
    """-> (observations [B, T, k], elementwise storage bound or None, extra States fields)."""
    from .models.surfaces import kv_observation

    if surface == "kv":
        present = [n for n in ("keys", "values") if n in tensors]
        part = meta.get("part") or (present[0] if len(present) == 1 else "both")
        need = ["keys", "values"] if part == "both" else [part]
        if any(n not in tensors for n in need):
            raise StatesError(f"{path}: kv part {part!r} needs tensors {need}, found {present}")
        got = {n: _stored(path, tensors, n, meta, (3, 4), "[B, n_kv_heads, T, head_dim] or [n_kv_heads, T, head_dim] "
                          "(HF cache layout)") for n in need}
        if len({got[n][0].shape[:-1] for n in need}) > 1:  # (widths may differ: DeepSeek-V3's latent and rotary parts)
            raise StatesError(f"{path}: keys and values differ in shape: {[list(got[n][0].shape) for n in need]}")
        x = kv_observation(got.get("keys", (None,))[0], got.get("values", (None,))[0], part)
        bounds = [got[n][1] for n in need]
        bound = None if bounds[0] is None else kv_observation(got.get("keys", (None, None))[1],
                                                              got.get("values", (None, None))[1], part)
        heads = got[need[0]][0].shape
        return x, bound, dict(part=part, kv_heads=(heads[1], heads[3]))
    name = next(n for n in SURFACE_TENSORS[surface] if n in tensors)
    x, bound = _stored(path, tensors, name, meta, (2, 3), f"[T, k] or [B, T, k] ({name})")
    if name == "sae_values":
        idx = tensors.get("sae_indices")
        idx = idx[None] if idx is not None and idx.dim() == 2 else idx  # (batched, as x is)
        if idx is None or idx.is_floating_point() or idx.shape != x.shape or int(idx.min()) < 0:
            raise StatesError(f"{path}: sae_values {list(x.shape)} need integer sae_indices of the same shape "
                              f"(the active latents' ids), found {None if idx is None else list(idx.shape)}")
        return x, bound, dict(sae_indices=idx.long())
    if surface != "projection":
        return x, bound, {}
    if "projection" not in tensors:
        raise StatesError(f"{path}: projected states without the projection matrix: the file needs a tensor "
                          "'projection' [k, d] (observations = states @ projectionᵀ)")
    P = tensors["projection"]
    if P.dim() != 2 or P.shape[0] != x.shape[-1] or not P.is_floating_point():
        raise StatesError(f"{path}: projection must be a float [k={x.shape[-1]}, d] matrix, got {list(P.shape)} {P.dtype}")
    return x, bound, dict(projection=P.float())


def _repeated_start(x: Tensor) -> int:
    """How many leading positions of one prompt's observations x [T, k] equal position 0 bit for bit, before a
    position that differs (0 if none does)."""
    same = (x == x[0]).all(-1).long().cumprod(0)
    run = int(same.sum())
    return run if run < len(x) else 0


def computed_in(x: Tensor, bound=None) -> str | None:
    """The precision a file that does not say its model's ("precision" metadata: sipit capture writes it; a
    transformers, TransformerLens, nnsight or vLLM file does not) was most likely computed in: its observations'
    16-bit float dtype, which those tools keep from the model (a bfloat16 model's hidden_states are bfloat16); None
    for float32 and for a storage format's codes (bound: its rounding, from float32 states)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(x.dtype) if bound is None else None


def _ids_in(path: Path, input_ids: Tensor, B: int, T: int, spans: list[tuple[int, int]]) -> list[list[int]]:
    """A padded batch's input_ids [B, T] (or [T]) -> each row's prompt ids (its spans), the file's ground truth."""
    input_ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    if list(input_ids.shape) != [B, T] or input_ids.is_floating_point():
        raise StatesError(f"{path}: input_ids {list(input_ids.shape)} {input_ids.dtype} do not fit the observations' "
                          f"[B, T] = {[B, T]}")
    return [input_ids[i, s:e].tolist() for i, (s, e) in enumerate(spans)]


def _validate(path: Path, tensors: dict, meta: dict) -> States:
    from .storage import storage_error

    surface = _surface(path, tensors, meta)
    x, bound, extra = _observations(path, surface, tensors, meta)
    B, T = x.shape[:2]
    try:
        lengths = json.loads(meta["lengths"]) if "lengths" in meta else [T] * B
        ids = json.loads(meta["ids"]) if "ids" in meta else None
        layer = int(meta["layer"]) if "layer" in meta else None
    except (ValueError, TypeError) as e:
        raise StatesError(f"{path}: malformed metadata: {e}") from e
    if len(lengths) != B or not all(0 < n <= T for n in lengths):
        hint = " (kv tensors must be in HF's layout [B, n_kv_heads, T, head_dim])" if surface == "kv" else ""
        raise StatesError(f"{path}: metadata 'lengths' {lengths} does not fit the observations {list(x.shape)}{hint}")
    spans = [(0, n) for n in lengths]
    if "attention_mask" in tensors:
        if "lengths" in meta:
            raise StatesError(f"{path}: both metadata 'lengths' and an attention_mask: give one")
        spans = _spans(path, tensors["attention_mask"], B, T)
        if ids is None and "input_ids" in tensors:
            ids = _ids_in(path, tensors["input_ids"], B, T, spans)
    if ids is not None and [len(i) for i in ids] != [e - s for s, e in spans]:
        raise StatesError(f"{path}: metadata 'ids' lengths {[len(i) for i in ids]} do not match the states "
                          f"{[e - s for s, e in spans]}")
    # the observations themselves (size, NaN) are checked where they are inverted (invert.as_prompts,
    # and per prompt in the loop: one non-finite prompt fails, the others are still recovered)
    prompts = [x[i, s:e] for i, (s, e) in enumerate(spans)]
    if "sae_indices" in extra:
        extra["sae_indices"] = [extra["sae_indices"][i, s:e] for i, (s, e) in enumerate(spans)]
    if surface == "sae" and bound is not None:  # (the SAE's reconstruction error is bounded from them: capture.py)
        extra["sae_bounds"] = [bound[i, s:e] for i, (s, e) in enumerate(spans)]
    error = None
    if bound is not None:
        error = max(storage_error(p, bound[i, s:e]) for i, (p, (s, e)) in enumerate(zip(prompts, spans)))
    return States(prompts, model=meta.get("model"), layer=layer, final_norm=meta.get("final_norm") == "true",
                  precision=meta.get("precision") or computed_in(x, bound), tokenizer=meta.get("tokenizer"), ids=ids,
                  meta=dict(meta),
                  surface=surface, error=error, left_padded=any(s > 0 for s, _ in spans), **extra)
