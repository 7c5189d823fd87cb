"""Hidden-state files: what `sipit capture` writes and `sipit invert` reads.

Format (design.md §2): safetensors with one tensor `hidden_states` [T, d] or [B, T, d]
(float32/float16/bfloat16) and string metadata:
    model, layer, final_norm ("true"/"false"), dtype, precision, tokenizer (fingerprint),
    ids (JSON list of id lists, optional ground truth), lengths (JSON list, when prompts in a
    [B, T, d] file have different lengths: positions past a prompt's length are padding).
`.npy` (no pickles) and `.pt` (loaded with weights_only=True; a tensor or {"hidden_states": ...})
are read too; they carry no metadata, so --model and --layer must be given.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from .io import SipitError, atomic_write

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class StatesError(SipitError):
    """A states file that cannot be used; the message says what is wrong with it."""


@dataclass
class States:
    """Per-prompt hidden states at one layer, plus what is known about how they were made."""

    prompts: list[Tensor]  # one [T_i, d] tensor per prompt
    model: str | None = None
    layer: int | None = None
    final_norm: bool = False
    precision: str | None = None
    tokenizer: str | None = None
    ids: list[list[int]] | None = None  # ground truth, when the file has it
    meta: dict = field(default_factory=dict)  # every metadata string, as stored

    @property
    def d_model(self) -> int:
        return self.prompts[0].shape[-1]


def save_states(path: str | Path, prompts: list[Tensor], *, model: str, layer: int, final_norm: bool,
                tokenizer: str, precision: str = "fp32", ids: list[list[int]] | None = None) -> Path:
    """Write per-prompt states [T_i, d] as one [B, T_max, d] tensor (zero-padded), atomically."""
    from safetensors.torch import save

    lengths = [len(p) for p in prompts]
    padded = torch.zeros(len(prompts), max(lengths), prompts[0].shape[-1], dtype=prompts[0].dtype)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = p
    meta = dict(model=model, layer=str(layer), final_norm=str(final_norm).lower(),
                dtype=str(padded.dtype).removeprefix("torch."), precision=precision, tokenizer=tokenizer)
    if len(set(lengths)) > 1:
        meta["lengths"] = json.dumps(lengths)
    if ids is not None:
        meta["ids"] = json.dumps([list(map(int, x)) for x in ids])
    return atomic_write(path, save({"hidden_states": padded.contiguous()}, metadata=meta))


def load_states(path: str | Path) -> States:
    """Read and validate a states file. Raises StatesError with one clear message."""
    path = Path(path)
    if not path.is_file():
        raise StatesError(f"states file not found: {path}")
    reader = {".safetensors": _read_safetensors, ".npy": _read_npy, ".pt": _read_pt, ".pth": _read_pt}
    if path.suffix not in reader:
        raise StatesError(f"{path}: unknown states format {path.suffix!r} (use .safetensors, .npy or .pt)")
    tensor, meta = reader[path.suffix](path)
    return _validate(path, tensor, meta)


def _read_safetensors(path: Path):
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if "hidden_states" not in f.keys():
                raise StatesError(f"{path}: no tensor named 'hidden_states' (found: {', '.join(f.keys()) or 'none'})")
            return f.get_tensor("hidden_states"), meta
    except StatesError:
        raise
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
    return torch.from_numpy(np.ascontiguousarray(arr)), {}


def _read_pt(path: Path):
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise StatesError(f"{path}: cannot load with weights_only=True (arbitrary pickles are refused; "
                          f"save a tensor or {{'hidden_states': tensor}}): {type(e).__name__}: {str(e)[:200]}") from e
    if isinstance(obj, dict):
        obj = obj.get("hidden_states")
    if not isinstance(obj, Tensor):
        raise StatesError(f"{path}: expected a tensor or a dict with 'hidden_states', got {type(obj).__name__}")
    return obj, {}


def _validate(path: Path, x: Tensor, meta: dict) -> States:
    if x.dim() not in (2, 3):
        raise StatesError(f"{path}: hidden_states must have shape [T, d] or [B, T, d], got {list(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise StatesError(f"{path}: hidden_states must be floating point, got {x.dtype}")
    if x.dim() == 2:
        x = x[None]
    if x.numel() == 0:
        raise StatesError(f"{path}: hidden_states is empty (shape {list(x.shape)})")
    try:
        lengths = json.loads(meta["lengths"]) if "lengths" in meta else [x.shape[1]] * x.shape[0]
        ids = json.loads(meta["ids"]) if "ids" in meta else None
        layer = int(meta["layer"]) if "layer" in meta else None
    except (ValueError, TypeError) as e:
        raise StatesError(f"{path}: malformed metadata: {e}") from e
    if len(lengths) != x.shape[0] or not all(0 < n <= x.shape[1] for n in lengths):
        raise StatesError(f"{path}: metadata 'lengths' {lengths} does not fit hidden_states {list(x.shape)}")
    if ids is not None and [len(i) for i in ids] != lengths:
        raise StatesError(f"{path}: metadata 'ids' lengths {[len(i) for i in ids]} do not match the states {lengths}")
    prompts = [x[i, :n] for i, n in enumerate(lengths)]
    bad = [i for i, p in enumerate(prompts) if not torch.isfinite(p).all()]
    if bad:
        raise StatesError(f"{path}: hidden_states contain NaN or inf (prompts {bad[:10]})")
    return States(prompts, model=meta.get("model"), layer=layer, final_norm=meta.get("final_norm") == "true",
                  precision=meta.get("precision"), tokenizer=meta.get("tokenizer"), ids=ids, meta=dict(meta))
