"""Fitting a Calibration from the model's own states, for one tap or for many layers in one pass.

One pass serves every requested layer: the vocabulary's position-0 states and the calibration text
go through the blocks once (`run_layers` captures every layer on the way), and each layer's ridge
fit is accumulated from streaming moments (float32 per batch, float64 sums), so no [N, S, d] states
are kept. The forward model, per layer:

    h_t ≈ A [e_v, table_v] + B ĥ_{t−1} + c   (ridge on standardised features)

The position-0 table is a nonlinear feature of the token (its state through all ℓ blocks without
context): at ℓ = 15 of SmolLM2 it cuts the mean rank of the true token from 6 to 0.1. The
residuals' covariance Σ gives the whitening W = Σ^{-1/2}; scores are Gaussian log-likelihoods.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor

from ...models.tap import LayerTap, run_taps
from .cache import Calibration, cache_path, calibration_key, load_cached
from .config import LearnedConfig
from .data import calibration_ids, random_ids
from .ranker import LinearRanker

Observe = Callable[[Tensor], list[Tensor]]  # ids [B, S] -> one [B, S, d] state tensor per target
VALIDATION_LEN = 20  # tokens per validation row


def _progress(it, desc: str):
    from tqdm import tqdm

    return tqdm(it, desc=desc, leave=False, disable=None)  # disable=None: silent when not a terminal


class Moments:
    """Streaming sums for the ridge fit of y [d] on x [F]: enough for means, covariances and residuals.
    Rows are shifted by the first batch's means before the float32 products (keeps rounding small)."""

    def __init__(self):
        self.n, self.shift = 0, None

    def add(self, X: Tensor, Y: Tensor) -> None:
        """X [n, F], Y [n, d]."""
        if self.shift is None:
            self.shift = (X.float().mean(0), Y.float().mean(0))
            F, d = X.shape[1], Y.shape[1]
            f64 = dict(dtype=torch.float64, device=X.device)
            self.sx, self.sy = torch.zeros(F, **f64), torch.zeros(d, **f64)
            self.sxx, self.sxy, self.syy = torch.zeros(F, F, **f64), torch.zeros(F, d, **f64), torch.zeros(d, d, **f64)
        X, Y = X.float() - self.shift[0], Y.float() - self.shift[1]
        self.n += len(X)
        self.sx += X.sum(0).double()
        self.sy += Y.sum(0).double()
        self.sxx += (X.T @ X).double()
        self.sxy += (X.T @ Y).double()
        self.syy += (Y.T @ Y).double()

    def ridge(self, lam: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Ridge on standardised x (λ·n on the diagonal). -> (Ws [F, d] in x's own units,
        x mean [F], y mean [d], residual covariance [d, d]); y ≈ y_mean + (x − x_mean) Ws."""
        n = self.n
        mx, my = self.sx / n, self.sy / n
        cxx = self.sxx / n - torch.outer(mx, mx)
        cxy = self.sxy / n - torch.outer(mx, my)
        cyy = self.syy / n - torch.outer(my, my)
        sd = (cxx.diagonal().clamp_min(0) * n / max(n - 1, 1)).sqrt().clamp_min(1e-6)  # as Tensor.std
        G = cxx / sd[:, None] / sd[None, :] + lam * torch.eye(len(sd), dtype=torch.float64, device=sd.device)
        Ws = torch.linalg.solve(G, cxy / sd[:, None]) / sd[:, None]
        resid = cyy - Ws.T @ cxy - cxy.T @ Ws + Ws.T @ cxx @ Ws
        return Ws, mx + self.shift[0].double(), my + self.shift[1].double(), resid


def _principal_basis(rows: Tensor, k: int, center: Tensor | None = None) -> Tensor:
    """Top-k right singular vectors of rows [V, d] (optionally centred), float64. [d, k]
    (float32 products suffice: eigh returns an orthonormal basis whatever the rounding, and only
    orthonormality makes projected distances certified lower bounds.)"""
    d = rows.shape[1]
    G = torch.zeros(d, d, dtype=torch.float64, device=rows.device)
    for chunk in rows.split(16384):
        x = chunk.float() - (center.float() if center is not None else 0)
        G += (x.T @ x).double()
    return torch.linalg.eigh(G)[1][:, -k:].flip(1)


@torch.no_grad()
def position0_tables(observe: Observe, V: int, device, batch: int = 1024, desc: str = "") -> list[Tensor]:
    """Every token's state at position 0, per target. -> list of [V, d]"""
    parts = [observe(torch.arange(i, min(V, i + batch), device=device)[:, None])
             for i in _progress(range(0, V, batch), f"calibration {desc}: position-0 table")]
    return [torch.cat([p[j][:, 0].float() for p in parts]) for j in range(len(parts[0]))]


@torch.no_grad()
def _forward_models(observe: Observe, E: Tensor, tables: list[Tensor], ids: Tensor, lam: float,
                    batch: int = 16, desc: str = "") -> list[dict[str, Tensor]]:
    """Per target: P, P_sq, white, Bw, cw (see Calibration) from the states of ids [N, S]."""
    moments = [Moments() for _ in tables]
    for i in _progress(range(0, len(ids), batch), f"calibration {desc}: states of text"):
        rows = ids[i:i + batch]
        v = rows[:, 1:].reshape(-1)
        for m, table, H in zip(moments, tables, observe(rows)):
            d = H.shape[-1]
            X = torch.cat([E[v], table[v], H[:, :-1].reshape(-1, d).float()], 1)  # [n, F]
            m.add(X, H[:, 1:].reshape(-1, d))
    out = []
    for m, table in zip(moments, tables):
        Ws, mx, my, resid = m.ridge(lam)
        ev, U = torch.linalg.eigh(resid)
        white = U @ torch.diag(ev.clamp_min(ev.max() * 1e-10) ** -0.5) @ U.T  # Σ^{-1/2} [d, d]
        de, dt = E.shape[1], table.shape[1]
        B = Ws[de + dt:]  # context part [d, d]
        A = (Ws[:de + dt] @ white).float()  # token part, whitened [de + dt, d]; float32 products suffice here
        P = torch.cat([torch.cat([e - mx[:de].float(), t - mx[de:de + dt].float()], 1) @ A
                       for e, t in zip(E.split(16384), table.split(16384))])  # [V, d]
        out.append(dict(P=P, P_sq=(P.double() ** 2).sum(1).float(), white=white.float(), Bw=(B @ white).float(),
                        cw=((my - mx[de + dt:] @ B) @ white).float()))
    return out


def _screening(parts: dict, table: Tensor, H: Tensor, ids: Tensor, cfg: LearnedConfig, tap) -> dict:
    """Position-0 subspace, the gain of the token part and the screening rank of P, chosen on fresh
    validation rows ids [n, S] with states H [n, S, d].

    The ridge predictions P are noisy, so shrinking them (score 2 r·P_v − g‖P_v‖²) picks the true
    token more often: g is the best of cfg.gains (SmolLM2, held-out prompts, top-1: ℓ = 30 prose
    74 → 76%, code 84 → 87%, random 59 → 65% at g = 0.7; ℓ = 15 prose 96 → 97%). The rank for P is
    the smallest of k, 2k, ... whose screened top-1 agrees with full scoring on ≥ cfg.screen_agree
    of the positions (SmolLM2: 128 at ℓ = 15; at ℓ = 1 whitening spreads P over every direction and
    no low rank agrees: full scoring there). A projection only shrinks distances, so the position-0
    subspace gives certified lower bounds."""
    d = table.shape[1]
    k = min(cfg.screen_rank, d)
    mean = table.double().mean(0)
    Q = _principal_basis(table, k, mean)
    out = dict(parts, t_mean=mean.float(), t_basis=Q.float(),
               t_proj=torch.cat([(c.double() - mean) @ Q for c in table.split(16384)]).float())  # float64: the bounds' slack assumes one rounding
    r = (H[:, 1:] @ parts["white"] - H[:, :-1] @ parts["Bw"] - parts["cw"]).reshape(-1, d)  # [n, d]
    truth = ids[:, 1:].reshape(-1)
    P, P_sq = parts["P"], parts["P_sq"]
    S = 2 * r @ P.T  # [n, V], once for every gain
    hits = {g: int(((S - g * P_sq).argmax(1) == truth).sum()) for g in cfg.gains}
    gain = max(cfg.gains, key=lambda g: (hits[g], g))  # ties: the least shrinkage
    full = (S - gain * P_sq).argmax(1)
    del S
    basis = _principal_basis(P, d)  # all directions, by decreasing variance
    proj = (P.double() @ basis).float()  # [V, d], sliced for each rank tried
    rank = k
    while True:
        out.update(p_basis=basis[:, :rank].float().contiguous(), p_proj=proj[:, :rank].contiguous())
        cal = Calibration(key="", table=table, gain=gain, seconds=0.0, **out)
        if rank == d or float((LinearRanker(cal, tap, cfg.screen_top).screen(r) == full).float().mean()) >= cfg.screen_agree:
            return cal
        rank = min(2 * rank, d)


def _lm_prior(cal: Calibration, tap, H_random: Tensor, cfg: LearnedConfig) -> None:
    """At the last layer the observed ĥ_{t−1} gives the LM's next-token distribution: a strong prior
    for text (SmolLM2, ℓ = 30, held-out prose: top-1 63% → 75%, mean rank 358 → 9) that hurts random
    ids. The gate: the mean LM log-prob of a prompt's plain guesses, text above, random below it
    (held-out SmolLM2 prompts: prose ≥ −11.4, random ≤ −13.5); it sits cfg.gate_margin nats above
    the 99th percentile of fresh random-id rows H_random [n, S, d]."""
    U = tap.lm.unembedding_rows()
    Q = _principal_basis(U, min(cfg.screen_rank, U.shape[1]))
    cal.u_basis, cal.u_proj = Q.float(), (U.double() @ Q).float()
    cal.lm_weight = cfg.lm_weight
    ranker = LinearRanker(cal, tap, cfg.screen_top)
    means = [float(ranker.lm_logprob(h, ranker.screen(ranker.context_residuals(h))).mean()) for h in H_random.float()]
    cal.lm_gate = float(torch.tensor(means).quantile(0.99)) + cfg.gate_margin


def observes_plain_states(tap) -> bool:
    """The LM prior reads the LM head off the observed state: only for plain residual-stream taps."""
    return getattr(tap, "plain_states", False)  # LayerTap: True; surfaces: False


@torch.no_grad()
def fit_calibrations(taps: list, observe: Observe, cfg: LearnedConfig) -> list[Calibration]:
    """Calibrations of several taps of one LM whose states `observe` returns together (one pass)."""
    t0 = time.perf_counter()
    lm = taps[0].lm
    desc = f"{lm.name} {','.join(t.key for t in taps)}"
    tables = position0_tables(observe, lm.vocab_size, lm.device, desc=desc)
    E = lm.embedding_rows().float()
    ids = calibration_ids(lm, cfg.calibration_tokens, cfg.seq_len, cfg.random_fraction).to(lm.device)
    parts = _forward_models(observe, E, tables, ids, cfg.ridge, desc=desc)
    val = calibration_ids(lm, cfg.validation_rows * cfg.seq_len, cfg.seq_len, cfg.random_fraction, seed=1)
    val = val[:, :VALIDATION_LEN].to(lm.device)
    gate = random_ids(lm.vocab_size, cfg.gate_rows, VALIDATION_LEN, seed=2).to(lm.device)
    H_val, H_gate = observe(val), observe(gate)
    out = []
    for j, tap in enumerate(taps):
        table = tables[j]
        fits16 = bool(torch.isfinite(table).all() and table.abs().max() < 6e4)
        cal = _screening(parts[j], table.half() if fits16 else table, H_val[j].float(), val, cfg, tap)
        if observes_plain_states(tap) and tap.layer == lm.n_layers:
            _lm_prior(cal, tap, H_gate[j], cfg)
        cal.key = calibration_key(tap, cfg)
        out.append(cal)
    seconds = time.perf_counter() - t0
    for cal in out:
        cal.seconds = seconds / len(out)  # the shared pass, split evenly
    return out


def calibrate(tap, config: LearnedConfig | None = None) -> Calibration:
    """Fit the calibration of any tap (LayerTap or one with the same interface, `dim` and `key`)."""
    return fit_calibrations([tap], lambda ids: [tap.states(ids)], config or LearnedConfig())[0]


def calibrate_layers(lm, layers: list[int], config: LearnedConfig | None = None,
                     final_norm: bool = False) -> list[Calibration]:
    """Calibrations of LayerTaps at several layers, their states computed in one pass."""
    return calibrate_taps(lm, [LayerTap(lm, layer, final_norm) for layer in layers], config)


def calibrate_taps(lm, taps: list, config: LearnedConfig | None = None) -> list[Calibration]:
    """Calibrations of several taps of `lm` (states, projections, KV caches, at any layers), their
    observations computed in one forward pass (`run_taps`)."""
    return fit_calibrations(taps, lambda ids: run_taps(lm, taps, ids), config or LearnedConfig())


def load_or_calibrate(tap, config: LearnedConfig | None = None) -> tuple[Calibration, float]:
    """The calibration of `tap` from the cache, or fitted now and cached. -> (it, seconds spent fitting)."""
    config = config or LearnedConfig()
    cal = load_cached(tap, config)
    if cal is not None:
        return cal, 0.0
    print(f"sipit: calibrating the learned policy for {tap.lm.name} {tap.key} (one-time; cached in "
          f"{cache_path(tap, config).parent})", file=sys.stderr)
    cal = calibrate(tap, config)
    cal.save(cache_path(tap, config))
    return cal, cal.seconds


def calibrate_cached_taps(lm, taps: list, config: LearnedConfig | None = None) -> dict[str, float]:
    """Make sure every tap's calibration is cached, fitting the missing ones in one pass.
    -> {tap.key: seconds spent fitting it (0 when it was cached)}"""
    config = config or LearnedConfig()
    taps = list({t.key: t for t in taps}.values())  # one fit per observed quantity
    missing = [t for t in taps if not cache_path(t, config).exists()]  # (a corrupt file is refitted on use)
    seconds = {t.key: 0.0 for t in taps}
    if missing:
        print(f"sipit: calibrating the learned policy for {lm.name} {', '.join(t.key for t in missing)} in one "
              f"pass (one-time; cached in {cache_path(missing[0], config).parent})", file=sys.stderr)
        for tap, cal in zip(missing, calibrate_taps(lm, missing, config)):
            cal.save(cache_path(tap, config))
            seconds[tap.key] = cal.seconds
    return seconds


def calibrate_cached_layers(lm, layers: list[int], config: LearnedConfig | None = None,
                            final_norm: bool = False) -> dict[int, float]:
    """calibrate_cached_taps for LayerTaps. -> {layer: seconds spent fitting it (0 when it was cached)}"""
    taps = [LayerTap(lm, layer, final_norm) for layer in layers]
    seconds = calibrate_cached_taps(lm, taps, config)
    return {t.layer: seconds[t.key] for t in taps}
