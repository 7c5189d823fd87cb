"""One-time calibration of the `learned` policy for one (model, layer, final_norm), cached on disk.

Fitted on the model's own states of offline text that ships with Python — the reference manual
(`pydoc_data.topics`) and half of the standard library's source files (those whose path hashes
even; benchmarks draw code from the other half) — plus uniform random ids. Never on prompts being
inverted. Two artefacts:

- `table` [V, d]: every token's state at position 0 (the state there depends on that token only),
  computed in batches through the tap. Stored in float16 when it fits (bound: STORE_ERR).
- a forward linear model of the state at position t ≥ 1 from the token's embedding and the
  previous observed state, h_t ≈ A e_v + B ĥ_{t−1} + c (ridge, standardised features, float64),
  with the whitening matrix W = Σ^{-1/2} of its residuals. Stored as what scoring needs:
  `P` [V, d] = W A e_v (whitened token predictions), `Bw`, `cw` such that the whitened residual of
  position t is r_t = W ĥ_t − Bw ĥ_{t−1} − cw, and score(v) = 2 r_t·P_v − ‖P_v‖² (the Gaussian
  log-likelihood of ĥ_t up to constants).
"""
from __future__ import annotations

import hashlib
import os
import random
import sysconfig
import time
from pathlib import Path

import torch
from torch import Tensor

from ..models import LayerTap
from ..models.load import cache_dir

VERSION = 1
SEQ_LEN = 64  # calibration sequences: positions 0..63 cover typical prompt lengths
RANDOM_FRACTION = 0.2  # share of calibration tokens that are uniform random ids
STORE_ERR = {torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}  # relative rounding of the table


def stdlib_files(calibration_half: bool) -> list[Path]:
    """Standard-library .py files (no tests), split in two halves by a hash of the relative path."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for r, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__", "test",
                                                         "tests", "idle_test"))
        for n in sorted(names):
            if n.endswith(".py"):
                rel = os.path.relpath(os.path.join(r, n), root)
                if (hashlib.sha1(rel.encode()).digest()[0] % 2 == 0) == calibration_half:
                    out.append(Path(root) / rel)
    return out


def calibration_texts() -> list[str]:
    from pydoc_data.topics import topics

    texts = [topics[k] for k in sorted(topics)]
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_files(calibration_half=True)]
    return texts


def calibration_ids(lm, n_tokens: int, seed: int = 0) -> Tensor:
    """[N, SEQ_LEN] ids: text spans (shuffled documents) and random-id rows."""
    rng = random.Random(seed)
    texts = calibration_texts()
    rng.shuffle(texts)
    n_random = int(n_tokens * RANDOM_FRACTION) // SEQ_LEN
    n_text = max(1, n_tokens // SEQ_LEN - n_random)
    rows, stream = [], []
    for text in texts:
        stream += lm.encode(text)
        while len(stream) >= SEQ_LEN and len(rows) < n_text:
            rows.append(stream[:SEQ_LEN])
            stream = stream[SEQ_LEN:]
        if len(rows) >= n_text:
            break
    g = torch.Generator().manual_seed(seed)
    rand = torch.randint(0, lm.vocab_size, (n_random, SEQ_LEN), generator=g)
    return torch.cat([torch.tensor(rows, dtype=torch.long).view(-1, SEQ_LEN), rand])


@torch.no_grad()
def position0_table(tap: LayerTap, batch: int = 1024) -> Tensor:
    """Every token's state at position 0. [V, d]"""
    V = tap.lm.vocab_size
    return torch.cat([tap.states(torch.arange(i, min(V, i + batch))[:, None])[:, 0] for i in range(0, V, batch)])


@torch.no_grad()
def fit_forward_model(tap: LayerTap, ids: Tensor, lam: float = 1e-3, batch: int = 16) -> dict[str, Tensor]:
    """Ridge fit of h_t from [e_v, h_{t−1}] on the states of ids [N, S]; returns scoring tensors."""
    E = tap.lm.embedding_rows().double()  # [V, d]
    d = E.shape[1]
    H = torch.cat([tap.states(ids[i:i + batch]) for i in range(0, len(ids), batch)]).double()  # [N, S, d]
    v = ids[:, 1:].reshape(-1)
    Y = H[:, 1:].reshape(-1, d)
    X = torch.cat([E[v], H[:, :-1].reshape(-1, d)], 1)  # [n, 2d]
    mu, sd = X.mean(0), X.std(0).clamp_min(1e-6)
    Xs = (X - mu) / sd
    ym = Y.mean(0)
    G = Xs.T @ Xs + lam * len(Xs) * torch.eye(2 * d, dtype=torch.float64)
    W = torch.linalg.solve(G, Xs.T @ (Y - ym))  # [2d, d]
    R = Y - ym - Xs @ W
    ev, U = torch.linalg.eigh(R.T @ R / len(R))
    white = U @ torch.diag(ev.clamp_min(ev.max() * 1e-10) ** -0.5) @ U.T  # Σ^{-1/2} [d, d]
    A = W[:d] / sd[:d, None]  # token part: Xs_tok @ W_tok = (E − mu) / sd @ W_tok
    Bm = W[d:] / sd[d:, None]
    const = ym - mu[:d] @ A - mu[d:] @ Bm
    P = (E @ A) @ white  # [V, d]
    return dict(P=P.float(), P_sq=(P ** 2).sum(1).float(), white=white.float(), Bw=(Bm @ white).float(),
                cw=(const @ white).float())


def cache_path(tap: LayerTap, n_tokens: int) -> Path:
    lm = tap.lm
    h = hashlib.sha256(f"{VERSION}:{lm.name}:{lm.tokenizer_fingerprint}:{n_tokens}".encode())
    for p in lm.model.parameters():  # weights fingerprint: a strided sample and the sum of each tensor
        flat = p.detach().flatten()
        h.update(flat[:: max(1, len(flat) // 64)].double().numpy().tobytes())
        h.update(flat.double().sum().numpy().tobytes())
    name = f"{Path(lm.name).name}-L{tap.layer}{'-norm' if tap.final_norm else ''}-{h.hexdigest()[:16]}"
    return cache_dir() / "invert" / f"{name}.safetensors"


def load_or_fit(tap: LayerTap, n_tokens: int) -> tuple[dict[str, Tensor], float]:
    """The calibration of `tap` (from the cache, or fitted and cached). Returns (tensors, seconds spent)."""
    from safetensors.torch import load_file, save_file

    path = cache_path(tap, n_tokens)
    if path.exists():
        try:
            return load_file(path), 0.0
        except Exception:  # a corrupt cache file is refitted
            pass
    t0 = time.perf_counter()
    out = fit_forward_model(tap, calibration_ids(tap.lm, n_tokens))
    table = position0_table(tap)
    fits16 = bool(torch.isfinite(table).all() and table.abs().max() < 6e4)
    out["table"] = table.half() if fits16 else table
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    save_file({k: v.contiguous() for k, v in out.items()}, str(tmp))
    tmp.replace(path)
    return out, time.perf_counter() - t0
