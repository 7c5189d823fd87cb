"""The fitted calibration of one tap (typed, saved with safetensors) and its content-keyed cache.

Key = the fingerprint of the weights the tap reads (`lm.fingerprint_through(tap.blocks_read)`:
embedding, final norm, LM head and blocks below the tap, never the blocks above) + what the tap
observes (`tap.key`) + the fit settings + VERSION: never the model's spec name, so one GGUF loaded
by name and by path shares one calibration, and a load with max_layer finds the whole model's. An
older VERSION is never migrated: it is simply a different file, refitted once.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import Tensor

from ...models.load import cache_dir
from .config import LearnedConfig
from .data import samples_possible

VERSION = 12  # bump whenever what is fitted, stored or keyed changes (6: the lens prior below the last layer; 7: P's
#             screen scores projected distances, so its rank is chosen anew; the table subspace keeps 64 columns;
#             8: the lens gate read from the screen's 64 best again; 9: refit, as a fit of this code chooses
#             SmolLM2 layer 1's screening rank 16 where the cached one under 8's key, fitted at 5e97427, has 32;
#             10: the LM head's screen rank chosen on the validation rows; 11: a screen's pick that ties with
#             full scoring's agrees with it, so a rank chosen higher for a tie is chosen anew; 12: a screen judged
#             only where full scoring is right, so a rank chosen higher for full scoring's own miss is chosen anew)


@dataclass
class Calibration:
    """What LinearRanker needs (V tokens, d = tap.dim, k, r ≤ d: screening ranks).

    Position 0, where the state depends on the token only, either (full calibration)
        table [V, d]      every token's state (float16 when that fits; else float32)
        t_mean [d], t_basis [d, k], t_proj [V, k]   its centred principal subspace
    or (fast calibration: table_tokens set; the four above None) a whitened linear model of it,
    fitted on a sample of tokens, r_0 = ĥ_0 W0 − c0w and score(v) = 2 r_0·p0_v − gain0 ‖p0_v‖² with
    p0_v = (e_v − mx0) A0 for the embedding rows e_v (position0_dots: p0 [V, d] is never made):
        A0 [e, d], mx0 [≥ e], p0_sq [V] = ‖p0_v‖², white0 [d, d] = W0, c0w [d], gain0
        p0_basis [d, k0] or None, p0_proj [V, k0], p0_proj_sq [V]   p0 in its principal subspace, the screen
                                        position0_scores reads instead of E [V, e] (None: E read whole)
        first_ids [n], first_rows [n, d] float32, first_radius [n] or None: the exact position-0 states of the
                                        calibration text's most frequent tokens and the special ones, each with half
                                        the distance to its nearest other (an observation that close is its token)
    Positions t ≥ 1, the forward model h_t ≈ A e_v + B ĥ_{t−1} + c whitened by W = Σ^{-1/2} of its
    residuals: the context residual r_t = ĥ_t W − ĥ_{t−1} Bw − cw, and score(v) = 2 r_t·P_v − gain ‖P_v‖²:
        P [V, d] = W A e_v, P_sq [V], white [d, d] = W, Bw [d, d], cw [d], gain
        p_basis [d, r], p_proj [V, r]   P in its principal subspace (r = d: scored exactly)
    LM prior (last layer of plain states only, else None):
        u_basis [d, k], u_proj [V, k]   LM-head rows in their principal subspace (k = d: u_basis the identity,
                                        u_proj None, the head's own rows)
        lm_gate: mean LM log-prob of a prompt's plain guesses above which the prior is on; lm_weight
    Lens prior (plain states below the last layer, else None): the LM head read through a translator
    of the observed state to the last layer's (a tuned lens, least squares on calibration text)
        lens_w [d, d], lens_b [d]: h_last ≈ ĥ lens_w + lens_b;  lens_gate: LinearRanker.lens_text_score
        above which a prompt's guesses are re-ranked with it (lm_weight)
    A fast calibration also keeps the token model P comes from, A [e, d] and mx [≥ e] (P = (E − mx) A for the
    embedding rows E [V, e]: `predictions`): its file stores those instead of the [V, ·] tensors made from them
    (MADE_ON_LOAD), which `load` makes again from E (Qwen2.5-1.5B: 2 GB a layer otherwise, 58 GB for all its 29).
    """

    key: str
    table: Tensor | None
    t_mean: Tensor | None
    t_basis: Tensor | None
    t_proj: Tensor | None
    P: Tensor
    P_sq: Tensor
    white: Tensor
    Bw: Tensor
    cw: Tensor
    p_basis: Tensor
    p_proj: Tensor
    gain: float
    seconds: float  # what fitting it cost
    u_basis: Tensor | None = None
    u_proj: Tensor | None = None
    lm_gate: float | None = None
    lm_weight: float | None = None
    p0_sq: Tensor | None = None
    white0: Tensor | None = None
    c0w: Tensor | None = None
    gain0: float | None = None
    lens_w: Tensor | None = None
    lens_b: Tensor | None = None
    lens_gate: float | None = None
    A: Tensor | None = None
    mx: Tensor | None = None
    A0: Tensor | None = None
    mx0: Tensor | None = None
    p0_basis: Tensor | None = None
    p0_proj: Tensor | None = None
    p0_proj_sq: Tensor | None = None
    first_ids: Tensor | None = None
    first_rows: Tensor | None = None
    first_radius: Tensor | None = None

    @property
    def has_prior(self) -> bool:
        return self.u_basis is not None

    def save(self, path: str | Path) -> Path:
        """Atomic safetensors file: tensors as tensors, the rest as string metadata."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors, meta = {}, {"version": str(VERSION)}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in MADE_ON_LOAD and self.A is not None:
                continue
            if isinstance(value, Tensor):
                tensors[f.name] = value.detach().cpu().contiguous()
            elif value is not None:
                meta[f.name] = value if isinstance(value, str) else repr(float(value))
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu",
             embedding: Tensor | Callable[[], Tensor] | None = None) -> "Calibration":
        """embedding: the model's embedding rows [V, e] (lm.embedding_rows(), or that method: called only for a
        fast calibration), from which a fast calibration's [V, ·] tensors are made. Raises ValueError for a file
        of another VERSION (callers refit) or a fast one without the embedding."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            if meta.get("version") != str(VERSION):
                raise ValueError(f"{path}: calibration version {meta.get('version')}, expected {VERSION}")
            values = {k: f.get_tensor(k) for k in f.keys()}
        for f in fields(cls):
            if f.name in meta:
                values[f.name] = meta[f.name] if f.name == "key" else float(meta[f.name])
            values.setdefault(f.name, None)  # what this calibration's mode does not store
        cal = cls(**values)
        if cal.A is not None:
            if embedding is None:
                raise ValueError(f"{path}: a fast calibration; loading it needs the model's embedding rows")
            with torch.no_grad():
                E = (embedding() if callable(embedding) else embedding).float().to(device)
                cal.P, cal.P_sq = predictions(E, cal.mx, cal.A)
                if cal.p0_sq is None:  # saved before p0_sq was stored (a fast file's only change since: not a VERSION)
                    cal.p0_sq = predictions(E, cal.mx0, cal.A0)[1]
                cal.p_proj = cal.P @ cal.p_basis
                if cal.p0_basis is not None:  # (files saved before it have none: position 0 reads E whole)
                    cal.p0_proj, cal.p0_proj_sq = predictions(E, cal.mx0, cal.A0 @ cal.p0_basis)
        return cal


MADE_ON_LOAD = ("P", "P_sq", "p_proj", "p0_proj", "p0_proj_sq")  # a fast calibration's [V, ·] tensors, made from E


def token_rows(E: Tensor, table: Tensor | None, v: Tensor) -> Tensor:
    """The token features of ids v [n]: [e_v, table_v], or e_v alone without a table. [n, F]"""
    return E[v] if table is None else torch.cat([E[v], table[v]], 1)


def predictions(E: Tensor, mx: Tensor, A: Tensor, table: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Every token's whitened prediction (its features − their mean mx[:F]) A [F, d], and its squared norm
    (float64 sums), a block of rows at a time into P, each block's norms while it is in cache (Qwen2.5-1.5B,
    V = 151,936, d = 1,536, this project's 2-core CPU: 7.6 → 4.9 s, the same tensors, than squaring a
    float64 copy of the whole P after joining the blocks; squared in place, 114 → 66 ms a block). -> [V, d], [V]"""
    P = torch.empty(len(E), A.shape[1], device=E.device)
    sq = torch.empty(len(E), dtype=torch.float64, device=E.device)
    mean = mx[:A.shape[0]].float()
    for start in range(0, len(E), 16384):
        end = min(start + 16384, len(E))
        rows = E[start:end] - mean if table is None else torch.cat([E[start:end], table[start:end]], 1).sub_(mean)
        torch.mm(rows, A, out=P[start:end])  # (slices, not token_rows' gather: one copy a block, the same numbers)
        sq[start:end] = P[start:end].double().square_().sum(1)
    return P, sq.float()


LENS_SHARE = 0.25  # of a calibration's own cost, the most its lens may add (lens_fitted)


def lens_fitted(tap, config: LearnedConfig) -> bool:
    """Whether the tap's calibration gets a lens prior: plain states below the last layer of a model loaded
    whole (the lens reads the last layer) that has a tokenizer (text to fit it on; random:<arch> has none),
    lens_rows > 0, and where the lens's pass (its rows through the blocks above the tap) costs no more than
    LENS_SHARE of the calibration's own (its tokens and position-0 states through the blocks below): low layers
    would pay much of a calibration for it and gain little (SmolLM2, seed-5 bench prompts, wrong first guesses of
    760 without → with a lens of 256 rows, fast calibrations: layer 2 10 → 7, 4 22 → 21, 8 46 → 47, 15 64 → 60,
    20 76 → 66; full: 8 26 → 22, 15 45 → 36). SmolLM2: layers ≥ 5 of 30, as when the lens had 256 rows and the
    share was 1 (fast calibrations have none: LearnedConfig.fast)."""
    lm = tap.lm
    if not (config.lens_rows > 0 and getattr(tap, "plain_states", False) and lm.tokenizer is not None
            and tap.layer < lm.depth == lm.n_layers):
        return False
    tokens, sample = config.sizes(lm.d_model, lm.vocab_size)
    own = (tokens + (lm.vocab_size if sample is None else sample)) * tap.layer
    return min(config.lens_rows * config.seq_len, tokens) * (lm.depth - tap.layer) <= LENS_SHARE * own


def samples_fitted(lm, config: LearnedConfig) -> bool:
    """Whether lm's calibrations fit on its own samples (data.model_samples): asked for, and lm can sample."""
    return config.sampled_fraction > 0 and samples_possible(lm)


def calibration_key(tap, config: LearnedConfig) -> str:
    """Content key: fingerprint of the weights the tap reads (every block's with a lens or the model's samples),
    what it observes, fit settings, VERSION."""
    lm, lens, samples = tap.lm, lens_fitted(tap, config), samples_fitted(tap.lm, config)
    settings = f"{VERSION}:{config.fit_key()}" + (":lens" if lens else "") + (":samples" if samples else "")
    tokens, sample = config.sizes(lm.d_model, lm.vocab_size)
    if tokens != config.calibration_tokens or sample not in (None, config.table_tokens):  # raised for a wide model
        settings += f":sizes={tokens},{sample}"
    settings = hashlib.sha256(settings.encode()).hexdigest()[:12]
    return f"{lm.fingerprint_through(lm.depth if lens or samples else tap.blocks_read)}-{tap.key}-{settings}"


def cache_path(tap, config: LearnedConfig) -> Path:
    return cache_dir() / "learned" / f"{calibration_key(tap, config)}.safetensors"


def stale_files() -> list[Path]:
    """Files of the calibration cache no sipit of this VERSION reads: calibrations of another VERSION (a
    VERSION bump leaves them; SmolLM2's full ones take ~200 MB a layer) or unreadable, and the temporary
    files of saves that were killed (their process gone)."""
    from safetensors import safe_open

    out = []
    for path in sorted((cache_dir() / "learned").glob("*")):
        if path.suffix == ".tmp":
            pid = path.suffixes[-2].lstrip(".") if len(path.suffixes) > 1 else ""
            if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
                out.append(path)
            continue
        try:
            with safe_open(str(path), framework="pt") as f:
                current = (f.metadata() or {}).get("version") == str(VERSION)
        except Exception:
            current = False
        if not current:
            out.append(path)
    return out


def load_cached(tap, config: LearnedConfig) -> Calibration | None:
    """The cached calibration of `tap`, or None (absent, unreadable or of another VERSION)."""
    path = cache_path(tap, config)
    if not path.exists():
        return None
    try:
        return Calibration.load(path, tap.lm.device, tap.lm.embedding_rows)
    except Exception:  # corrupt or stale: refitted by the caller
        return None
