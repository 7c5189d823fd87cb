"""Fitting a Calibration from the model's own states, for one tap or for many taps in one pass.

One pass serves every requested tap (states, projections, KV caches, at any layers): the
vocabulary's position-0 states and the calibration text go through the blocks once (`run_taps`
reads every tap's observation off that pass), and each tap's ridge fit is accumulated from
streaming moments (float32 per batch, float64 sums; the token features' block once per distinct
token: TokenMoments), so no [N, S, d] states are kept. The forward model, per tap:

    h_t ≈ A [e_v, table_v] + B ĥ_{t−1} + c   (ridge on standardised features)

The position-0 table is a nonlinear feature of the token (its state through all ℓ blocks without
context): at ℓ = 15 of SmolLM2 it cuts the mean rank of the true token from 6 to 0.1. The
residuals' covariance Σ gives the whitening W = Σ^{-1/2}; scores are Gaussian log-likelihoods.

Below the last layer (plain states, a model loaded whole, where it costs no more than the calibration:
cache.lens_fitted) the first `lens_rows` rows also go on to the last layer, and a ridge translator
h_last ≈ ĥ lens_w + lens_b (a tuned lens) lets the ranker read the LM head off an observed state: a prior
for the guesses of text-like prompts (ranker.lens_guesses).

Fast calibration (LearnedConfig.table_tokens set, `--calibration fast`): the table costs V tokens
through ℓ blocks (half of SmolLM2's calibration at ℓ = 30; over an hour for a 1.5B model with
V = 151,936 on 2 cores), so only a seeded sample of table_tokens tokens goes through at position 0,
and a whitened ridge model h_0 ≈ A0 e_v + c0 fitted on them ranks position 0 like every other
position; the exact position-0 states of the calibration text's most frequent tokens are kept beside it (the
tokens text starts with most, newlines and punctuation, are those it predicts worst: first_token_rows). It gives up
the table feature (t ≥ 1 fits [e_v, ĥ_{t−1}] only: a weaker ranker at deep layers) and the certified lower bounds
at position 0 (position 0 is certified only by evaluating candidates); it keeps exactness: the loop verifies every
accepted token whatever the ranker says.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import torch
from torch import Tensor

from ...models.device import memory_left, screen_dtype
from ...models.tap import LayerTap, position0_tables, run_taps
from .cache import Calibration, cache_path, calibration_key, lens_fitted, load_cached, predictions, token_rows
from .config import LearnedConfig
from .data import calibration_ids, random_ids
from .ranker import LinearRanker, position0_dots, position0_exact, position0_scores, squared_distances, squared_norms

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
            self._start(X, Y)
        X, Y = X.float() - self.shift[0], Y.float() - self.shift[1]
        self.n += len(X)
        self.sx += X.sum(0).double()
        self.sy += Y.sum(0).double()
        self.sxx += (X.T @ X).double()
        self.sxy += (X.T @ Y).double()
        self.syy += (Y.T @ Y).double()

    def _start(self, X: Tensor, Y: Tensor) -> None:
        """The shift (the first batch's means) and zeroed float64 sums for x [F], y [d]."""
        self.shift = (X.float().mean(0), Y.float().mean(0))
        F, d = X.shape[1], Y.shape[1]
        f64 = dict(dtype=torch.float64, device=X.device)
        self.sx, self.sy = torch.zeros(F, **f64), torch.zeros(d, **f64)
        self.sxx, self.sxy, self.syy = torch.zeros(F, F, **f64), torch.zeros(F, d, **f64), torch.zeros(d, d, **f64)

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


class TokenMoments(Moments):
    """Moments for x = [f_v, c]: f_v token v's features (cache.token_rows: its embedding, and its position-0 state
    with a table; Ft columns), and c [d] per position. Tokens repeat, so the
    f·fᵀ block is summed once per distinct token, Σ_v count_v f_v f_vᵀ, when the fit is solved, not per
    position: the forward model's moments (Ft = 2d, F = 3d) cost 7 instead of 13 products of n·d² (SmolLM2:
    49,152 calibration positions, ~15,000 distinct tokens)."""

    def __init__(self, E: Tensor, table: Tensor | None):
        super().__init__()
        self.E, self.table = E, table

    def _rows(self, v: Tensor) -> Tensor:
        return token_rows(self.E, self.table, v).float()  # [n, Ft]

    def add_tokens(self, v: Tensor, C: Tensor, Y: Tensor) -> None:
        """Token ids v [n], context features C [n, d], targets Y [n, dy]."""
        T, d = self._rows(v), C.shape[1]
        Ft, V = T.shape[1], len(self.E)
        if self.shift is None:
            self._start(torch.cat([T, C.float()], 1), Y)
            self.counts = torch.zeros(V, dtype=torch.long, device=v.device)
        T, C, Y = T - self.shift[0][:Ft], C.float() - self.shift[0][Ft:], Y.float() - self.shift[1]
        self.n += len(v)
        self.counts += torch.bincount(v, minlength=V)
        self.sx += torch.cat([T.sum(0), C.sum(0)]).double()
        self.sy += Y.sum(0).double()
        D = torch.cat([C, Y], 1)  # [n, d + dy]
        TD, CD = (T.T @ D).double(), (C.T @ D).double()
        self.sxx[:Ft, Ft:] += TD[:, :d]
        self.sxy[:Ft] += TD[:, d:]
        self.sxx[Ft:, Ft:] += CD[:, :d]
        self.sxy[Ft:] += CD[:, d:]
        self.syy += (Y.T @ Y).double()

    def ridge(self, lam: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        Ft = self.E.shape[1] + (0 if self.table is None else self.table.shape[1])
        self.sxx[:Ft, :Ft] = 0
        for ids in self.counts.nonzero()[:, 0].split(4096):  # Σ_v count_v (f_v − shift)(f_v − shift)ᵀ
            x = (self._rows(ids) - self.shift[0][:Ft]) * self.counts[ids].float().sqrt()[:, None]
            self.sxx[:Ft, :Ft] += (x.T @ x).double()
        self.sxx[Ft:, :Ft] = self.sxx[:Ft, Ft:].T
        return super().ridge(lam)


def _principal_basis(rows: Tensor, k: int, center: Tensor | None = None) -> Tensor:
    """Top-k right singular vectors of rows [V, d] (optionally centred), float64. [d, k]
    (float32 products suffice: eigh returns an orthonormal basis whatever the rounding, and only
    orthonormality makes projected distances certified lower bounds.)"""
    return torch.linalg.eigh(_gram(rows, center))[1][:, -k:].flip(1)


def _gram(rows: Tensor, center: Tensor | None = None) -> Tensor:
    """xᵀx of rows [V, d] (optionally centred), float64, a block at a time. [d, d]"""
    d = rows.shape[1]
    G = torch.zeros(d, d, dtype=torch.float64, device=rows.device)
    for chunk in rows.split(16384):
        x = chunk.float() - (center.float() if center is not None else 0)
        G += (x.T @ x).double()
    return G


@torch.no_grad()
def table_sample(V: int, n: int, seed: int = 3) -> Tensor:
    """Fast mode: the seeded uniform sample of token ids whose position-0 states are computed. [n]"""
    return torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n].sort().values


def first_tokens(lm, ids: Tensor, k: int) -> Tensor:
    """Fast mode: the tokens whose exact position-0 states the calibration keeps: the k most frequent of the calibration
    rows ids [N, S] and the tokenizer's special tokens; none for a model without a tokenizer (random:<arch>: its rows
    and prompts are uniform random ids, no token more frequent than another). [n] ascending, on the CPU"""
    if lm.tokenizer is None:
        return torch.zeros(0, dtype=torch.long)
    counts = torch.bincount(ids.flatten().cpu(), minlength=lm.vocab_size)
    top = counts.topk(min(k, int((counts > 0).sum()))).indices
    return torch.unique(torch.cat([top, lm.special_ids()]))


@torch.no_grad()
def first_token_rows(observe: Observe, first: Tensor, device, batch: int = 256) -> list[dict[str, Tensor]]:
    """Fast mode, per target: the position-0 states of the ids first [n] (observe: the model in its own precision,
    not a lower-precision copy: states with massive activations at position 0 lie close together, and a bfloat16
    copy's error put 800 of SmolLM2's 1,027 kept states at layer 15 and 997 at 30 past their own radius:
    first_token_near.py) and each one's radius, half the distance to its nearest other: an observation within it of a
    state is nearer that state than any other kept one. -> [{first_ids [n], first_rows [n, d] float32, first_radius [n]}]"""
    states = [torch.cat(rows) for rows in zip(*(observe(v[:, None].to(device)) for v in first.split(batch)))]
    out = []
    for rows in states:
        rows = rows[:, 0].float()
        exact = rows.double()
        D = squared_distances(exact, exact, squared_norms(exact)).fill_diagonal_(float("inf"))  # [n, n]
        out.append(dict(first_ids=first.to(device), first_rows=rows,
                        first_radius=(D.min(1).values.clamp_min(0).sqrt() / 2).float()))
    return out


def _whitening(resid: Tensor) -> Tensor:
    """Σ^{-1/2} of a residual covariance [d, d] (tiny eigenvalues clamped). [d, d] float64"""
    ev, U = torch.linalg.eigh(resid)
    return U @ torch.diag(ev.clamp_min(ev.max() * 1e-10) ** -0.5) @ U.T


@torch.no_grad()
def position0_models(observe: Observe, E: Tensor, sample: Tensor, lam: float, batch: int = 1024,
                     desc: str = "") -> list[dict[str, Tensor]]:
    """Fast mode, per target: a ridge model h_0 ≈ A0 e_v + c0 fitted on the position-0 states of the sampled
    ids [n] only: A0 [F, d] (whitened), mx0 [F], white0, c0w (see Calibration). The norms of its predictions of
    every token, p0_sq, are made one target at a time after the pass (cache.predictions, in _calibration)."""
    moments = None
    for v in _progress(sample.split(batch), f"calibration {desc}: position-0 sample"):
        states = observe(v[:, None])
        moments = moments or [Moments() for _ in states]
        for m, H in zip(moments, states):
            m.add(E[v], H[:, 0])
    out = []
    while moments:  # (each target's sums freed once solved)
        Ws, mx, my, resid = moments.pop(0).ridge(lam)
        white = _whitening(resid)
        out.append(dict(A0=(Ws @ white).float(), mx0=mx, white0=white.float(), c0w=(my @ white).float()))
    return out


@torch.no_grad()
def _forward_models(observe: Observe, E: Tensor, tables: list[Tensor | None], ids: Tensor, lam: float,
                    batch: int = 16, desc: str = "", lens: tuple | None = None) -> list[dict[str, Tensor]]:
    """Per target: A [F, d] (the token features' whitened part, whose predictions of every token, P and P_sq,
    fit_calibrations makes one target at a time), mx [F + d], white, Bw, cw (see Calibration) from the states
    of ids [N, S] (tables: per target the position-0 table, a token feature, or None in fast mode). lens: (observe_to_last,
    rows, targets): for the first `rows` rows observe_to_last gives the observations and then the last layer's
    states [B, S, d], and the targets listed also get lens_w, lens_b (h_last ≈ ĥ lens_w + lens_b, ridge)."""
    moments = [TokenMoments(E, table) for table in tables]
    lens_moments = {j: Moments() for j in (lens[2] if lens else [])}
    for i in _progress(range(0, len(ids), batch), f"calibration {desc}: states of text"):
        rows = ids[i:i + batch]
        v = rows[:, 1:].reshape(-1)
        if lens_moments and i < lens[1]:
            *states, last = lens[0](rows)
            for j, m in lens_moments.items():
                m.add(states[j].reshape(-1, states[j].shape[-1]), last.reshape(-1, last.shape[-1]))
        else:
            states = observe(rows)
        for m, H in zip(moments, states):
            d = H.shape[-1]
            m.add_tokens(v, H[:, :-1].reshape(-1, d), H[:, 1:].reshape(-1, d))
    out = []
    for table in tables:  # (each target's sums freed once solved)
        Ws, mx, my, resid = moments.pop(0).ridge(lam)
        white = _whitening(resid)
        F = E.shape[1] + (0 if table is None else table.shape[1])
        B = Ws[F:]  # context part [d, d]
        out.append(dict(A=(Ws[:F] @ white).float(), mx=mx, white=white.float(), Bw=(B @ white).float(),
                        cw=((my - mx[F:] @ B) @ white).float()))
    for j, m in lens_moments.items():
        Ws, mx, my, _ = m.ridge(lam)
        out[j].update(lens_w=Ws.float(), lens_b=(my - mx @ Ws).float())
    return out


def _table_subspace(table: Tensor, k: int) -> dict:
    """The position-0 table and its centred principal subspace (see Calibration). A projection only
    shrinks distances, so the subspace gives certified lower bounds."""
    mean = table.double().mean(0)
    Q = _principal_basis(table, k, mean)
    return dict(table=table, t_mean=mean.float(), t_basis=Q.float(),
                t_proj=torch.cat([c.double().sub_(mean) @ Q for c in table.split(16384)]).float())  # float64: the bounds' slack assumes one rounding


def _position0_screen(p0: dict, E: Tensor, H0: Tensor, full: Tensor, truth: Tensor, cfg: LearnedConfig,
                      gram: Tensor) -> dict:
    """Fast mode: the principal subspace of the position-0 predictions p0_v = (e_v − mx0) A0 in which position 0 is
    screened (position0_scores), of the smallest rank of cfg.screen_rank, twice that, ... whose guesses agree with
    full scoring (full: its guesses [n], _position0_gain's; _agreement) on ≥ cfg.screen_agree of the fresh
    position-0 states H0 [n, d] of the tokens truth [n]; none (E read whole) where no rank up to d/2 does: a screen
    that reads more saves little beside its exact step (Gemma-3-270M: the fit kept 32 / 256 / 512 of 640 at layers
    1 / 9 / 18, and 512 was no faster than the whole read: position0_screen_ab.txt).
    p0: position0_models' fields with p0_sq and gain0; gram: _gram(E, p0's mx0), p0's Gram from it.
    -> {p0_basis [d, k0], p0_proj [V, k0], p0_proj_sq [V]} or {}"""
    d = p0["A0"].shape[1]
    A0 = p0["A0"].double()  # p0's Gram from the centred embedding rows': no [V, d] made
    basis = torch.linalg.eigh(A0.T @ gram @ A0)[1].flip(1).float()  # [d, d]: by decreasing variance
    r0 = H0.float() @ p0["white0"] - p0["c0w"]
    scores = lambda ids: position0_exact(r0, SimpleNamespace(**p0), E, ids[:, None])[:, 0]  # exact, [n]
    rank = min(cfg.screen_rank, d)
    while rank <= d // 2:
        U = basis[:, :rank].contiguous()
        proj, proj_sq = predictions(E, p0["mx0"], p0["A0"] @ U)  # (as Calibration.load makes them)
        screen = dict(p0_basis=U, p0_proj=proj, p0_proj_sq=proj_sq)
        guesses = position0_scores(r0, SimpleNamespace(**p0, **screen), E, cfg.screen_top)[0]
        if _agreement(guesses, full, truth, scores) >= cfg.screen_agree:
            return screen
        rank *= 2
    return {}


def _agreement(picks: Tensor, full: Tensor, truth: Tensor, scores) -> float:
    """How often a screen's picks [n] do as well as full scoring's top-1 [n] where it matters: a position counts
    against the screen only where full scoring picks the truth [n] and the screen's pick scores lower (scores:
    ids [n] -> their exact scores [n]). Where full scoring is wrong it costs a pass whatever the screen picks
    (SmolLM2's fast layer 15 on an AVX2-only CPU: at one of 608 validation positions full scoring picked a wrong
    token and every screen of rank 32-128 the true one, and the fit took rank 256, a first look that reads a
    [V, 259] screen where [V, 35] loses no right guess: screen_rank_ties.py). A pick that ties with full scoring's
    agrees with it: tokens with equal rows tie, and a screen need not keep their order (SmolLM2 has 9 tokens with
    one embedding row; on that CPU one validation position of layer 1 tied two of them, and the fit took rank 512)."""
    lost = (full == truth) & (scores(picks) < scores(full))
    return 1 - float(lost.float().mean())


def _best_gain(S: Tensor, P_sq: Tensor, truth: Tensor, gains) -> tuple[float, Tensor]:
    """The gain g of cfg.gains whose scores S − g·P_sq [n, V] rank the true ids [n] first most often
    (ties: the least shrinkage). -> (g, the top-1 ids [n] at g)"""
    top = {g: [] for g in gains}
    block = S.new_empty(min(64, len(S)), S.shape[1])  # (one [64, V] block for every product, in cache; a fresh
    for rows in S.split(64):  # temporary per gain and block took half the time: 516 → 279 ms for SmolLM2's 608 rows)
        for g in gains:  # (max's indices are argmax's, the first of equal maxima; 2.6 ms a block where argmax took 3.7)
            top[g].append(torch.sub(rows, g * P_sq, out=block[:len(rows)]).max(1).indices)
    top = {g: torch.cat(ids) for g, ids in top.items()}
    best = max(gains, key=lambda g: (int((top[g] == truth).sum()), g))
    return best, top[best]


def _position0_gain(p0: dict, E: Tensor, H0: Tensor, truth: Tensor, gains) -> tuple[float, Tensor]:
    """Fast mode: the gain of the position-0 model p0 (position0_models', with p0_sq), chosen on fresh position-0
    states H0 [n, d] of ids truth [n]; E: the embedding rows [V, e]. -> (it, the guesses [n] of full scoring at it,
    position0_full's)"""
    r0 = H0.float() @ p0["white0"] - p0["c0w"]
    return _best_gain(2 * position0_dots(r0, p0["A0"], p0["mx0"], E), p0["p0_sq"], truth, gains)


def _ranker(cal: Calibration, tap, cfg: LearnedConfig) -> LinearRanker:
    """The ranker the fit measures with, as the policy builds it but screening in float32 (a calibration never
    depends on the hardware that fitted it)."""
    return LinearRanker(cal, tap, cfg.screen_top, torch.float32, guess_top=cfg.guess_top)


def _screening(parts: dict, H: Tensor, ids: Tensor, cfg: LearnedConfig, tap) -> Calibration:
    """The gain of the token part and the screening rank of P, chosen on fresh validation rows
    ids [n, S] with states H [n, S, d]; parts: the fitted fields (position 0's included).

    The ridge predictions P are noisy, so shrinking them (score 2 r·P_v − g‖P_v‖²) picks the true
    token more often: g is the best of cfg.gains (SmolLM2, held-out prompts, top-1: ℓ = 30 prose
    74 → 76%, code 84 → 87%, random 59 → 65% at g = 0.7; ℓ = 15 prose 96 → 97%). The rank for P is
    the smallest of k, 2k, ... whose screened top-1 does as well as full scoring's on ≥ cfg.screen_agree of the
    positions, where full scoring is right (_agreement; SmolLM2: 32 at ℓ = 1 and 15, 256 at ℓ = 30, from
    cfg.screen_rank = 16)."""
    out = dict(parts)
    d = out["P"].shape[1]
    r = (H[:, 1:] @ parts["white"] - H[:, :-1] @ parts["Bw"] - parts["cw"]).reshape(-1, d)  # [n, d]
    truth = ids[:, 1:].reshape(-1)
    P, P_sq = parts["P"], parts["P_sq"]
    gain, full = _best_gain(2 * r @ P.T, P_sq, truth, cfg.gains)  # ([n, V] scores, once for every gain)
    basis = _principal_basis(P, d).float()  # all directions, by decreasing variance

    def screen(rank: int) -> tuple[Tensor, Tensor]:  # P's screen of a rank: p_basis [d, rank], p_proj [V, rank]
        p_basis = basis[:, :rank].contiguous()  # (float32 projections: the screen only orders candidates)
        return p_basis, P.float() @ p_basis  # (as Calibration.load makes it)

    rank = min(cfg.screen_rank, d)
    p_basis, p_proj = screen(rank)
    cal = Calibration(key="", gain=gain, seconds=0.0, **out, p_basis=p_basis, p_proj=p_proj)
    ranker = _ranker(cal, tap, cfg)  # (one ranker for every rank tried: only its screen changes)
    scores = lambda ids: ranker.exact_scores(ids[:, None], r, gain)[:, 0]  # exact, [n]
    while rank < d and _agreement(ranker.screen(r), full, truth, scores) < cfg.screen_agree:
        rank = min(2 * rank, d)
        cal.p_basis, cal.p_proj = screen(rank)
        ranker.use_screen()
    return cal


def _lm_prior(cal: Calibration, tap, validation: tuple[Tensor, Tensor], H_random: Tensor, cfg: LearnedConfig) -> None:
    """At the last layer the observed ĥ_{t−1} gives the LM's next-token distribution: a strong prior
    for text (SmolLM2, ℓ = 30, held-out prose: top-1 63% → 75%, mean rank 358 → 9) that hurts random
    ids. The gate: the mean LM log-prob of a prompt's plain guesses, text above, random below it
    (held-out SmolLM2 prompts: prose ≥ −11.4, random ≤ −13.5); it sits cfg.gate_margin nats above
    the 99th percentile of fresh random-id rows H_random [n, S, d].

    The guesses screen the head through its principal subspace, of the smallest rank of head_rank, 2·head_rank,
    ..., d whose prior guesses on the validation text rows (validation: ids [n, S], states [n, S, d]) are wrong no
    more often than the whole head's: a screen of too low a rank can drop the tokens the LM ranks first (SmolLM2
    ℓ = 30: 101 / 95 / 83 / 74 of 494 wrong at ranks 128 / 256 / 512 / 576, so the whole head; Gemma-3-270M ℓ = 18,
    fast: 67 / 67 / 67 / 68 of 494, so 128). At rank d the screen is the head itself (u_proj None)."""
    U = tap.lm.unembedding_rows()
    d = U.shape[1]
    basis = _principal_basis(U, d).float()  # [d, d], by decreasing variance
    rotated = U.float() @ basis  # [V, d]: the head in that basis, whose first k columns are rank k's u_proj
    cal.lm_weight = cfg.lm_weight
    ranker = _ranker(cal, tap, cfg)  # (no prior yet; one ranker for every rank tried: only its head screen changes)

    def rows(H: Tensor) -> tuple[Tensor, Tensor]:  # states [n, S, d] -> residuals, normed previous states [n(S-1), d]
        return ranker.context_residuals(*H.float()), ranker.normed(H[:, :-1].float()).reshape(-1, d).float()

    ids, H_val = validation
    text = len(ids) - _random_rows(len(ids), cfg)  # (calibration_ids puts the random-id rows last)
    r, n = rows(H_val[:text])
    truth = ids[:text, 1:].reshape(-1)

    def at(rank: int) -> LinearRanker:  # the calibration's head screen at a rank, and the ranker with it
        cal.u_basis = basis[:, :rank].contiguous() if rank < d else torch.eye(d, device=U.device)
        cal.u_proj = rotated[:, :rank].contiguous() if rank < d else None
        ranker.use_head()
        return ranker

    at(_smallest_as_good(lambda k: int((at(k).screen_prior(r, n) != truth).sum()), cfg.head_rank, d))
    logp = ranker.prior_screens(*rows(H_random))[1]  # the plain guesses' LM log-probs
    cal.lm_gate = _above_random([float(lp.mean()) for lp in logp.split(H_random.shape[1] - 1)], cfg)


def _smallest_as_good(wrong, first: int, d: int) -> int:
    """The smallest rank of first, 2·first, ..., d whose wrong(rank) (guesses) is no more than wrong(d)'s (d itself
    evaluated once: SmolLM2's layer 30 takes the whole head, and each evaluation reads it for 494 rows, ~1 s)."""
    whole, rank = wrong(d), min(first, d)
    while rank < d and wrong(rank) > whole:
        rank = min(2 * rank, d)
    return rank


def _random_rows(rows: int, cfg: LearnedConfig) -> int:
    """How many of calibration_ids' `rows` rows of cfg.seq_len are random ids (its last ones)."""
    return int(rows * cfg.seq_len * cfg.random_fraction) // cfg.seq_len


def _above_random(scores: list[float], cfg: LearnedConfig) -> float:
    """A text/random gate: cfg.gate_margin above the 99th percentile of random-id rows' scores."""
    return float(torch.tensor(scores).quantile(0.99)) + cfg.gate_margin


def _lens_gate(cal: Calibration, tap, H_random: Tensor, cfg: LearnedConfig) -> None:
    """Below the last layer, the lens prior's weight and gate: LinearRanker.lens_text_score of text sits above
    it, of random ids below (SmolLM2 ℓ = 15, full calibration, the seed-5 bench prompts: text −5.4 to −1.4, random
    −7.7 to −6.3, the gate −4.6); placed as the LM prior's is (_above_random), on fresh random-id rows H_random
    [n, S, d]."""
    cal.lm_weight = cfg.lm_weight
    ranker = _ranker(cal, tap, cfg)
    H = list(H_random.float())
    top, _ = ranker.screen_best(ranker.context_residuals(*H))
    logits = ranker.lens_logits(torch.cat([h[:-1] for h in H]), top).split([len(h) - 1 for h in H])
    cal.lens_gate = _above_random([ranker.lens_text_score(x) for x in logits], cfg)


def observes_plain_states(tap) -> bool:
    """The LM prior reads the LM head off the observed state: only for plain residual-stream taps."""
    # LayerTap: True, but not Gemma-3n's several streams, which the model mixes before its final norm; surfaces: False
    return getattr(tap, "plain_states", False) and tap.lm.streams == 1


def lm_prior_fitted(tap) -> bool:
    """Whether the tap's calibration gets the LM prior: plain states at the model's last layer (depth, not
    n_layers: max_layer may cut the model)."""
    return observes_plain_states(tap) and tap.layer == tap.lm.depth


@torch.no_grad()  # (around each step of the generator)
def fit_calibrations(taps: list, observe: Observe, cfg: LearnedConfig, observe_to_last: Observe | None = None,
                     observe_exact: Observe | None = None) -> Iterator[Calibration]:
    """Calibrations of several taps of one LM whose states `observe` returns together (one pass), yielded one
    at a time in taps' order; observe_to_last: the same and then the last layer's states, for the lens
    (cache.lens_fitted); observe_exact: the same by the model itself where `observe` runs a lower-precision copy
    (fast mode's kept first-token states: first_token_rows). The pass holds only each tap's moments (and, in full
    mode, its table); a tap's [V, d] predictions are made after it, tap by tap, so a caller that saves and drops
    each calibration holds one (Qwen2.5-1.5B, V = 151,936: 1.8 GB of predictions per layer in fast mode; all 29
    layers' at once were killed for memory on a 24 GB machine). Each one's seconds: the pass's, split evenly, and its own."""
    t0 = time.perf_counter()
    lm = taps[0].lm
    desc = f"{lm.name} {','.join(t.key for t in taps)}"
    E = lm.embedding_rows().float()
    fast = not cfg.has_table(lm.vocab_size)
    n_tokens, n_sample = cfg.sizes(lm.d_model, lm.vocab_size)
    ids = calibration_ids(lm, n_tokens, cfg.seq_len, cfg.random_fraction, sampled_fraction=cfg.sampled_fraction).to(lm.device)
    gram0 = None  # fast mode: the Gram of the embedding rows less the position-0 models' mean, shared by the taps
    if fast:  # a sample of position-0 states and a linear model of the rest; no table feature
        pos0 = position0_models(observe, E, table_sample(lm.vocab_size, n_sample).to(lm.device), cfg.ridge,
                                desc=desc)
        first = first_tokens(lm, ids, cfg.first_tokens)
        for p, kept in zip(pos0, first_token_rows(observe_exact or observe, first, lm.device) if len(first) else []):
            p.update(kept)
        tables = [None] * len(pos0)
        gram0 = _gram(E, pos0[0]["mx0"][:E.shape[1]])  # (every target's model sees the same embedding rows: one mx0)
    else:
        tables = position0_tables(observe, lm.vocab_size, lm.device, desc=f"calibration {desc}")
    with_lens = [j for j, tap in enumerate(taps) if lens_fitted(tap, cfg)] if observe_to_last else []
    models = _forward_models(observe, E, tables, ids, cfg.ridge, desc=desc,
                             lens=(observe_to_last, cfg.lens_rows, with_lens) if with_lens else None)
    val = calibration_ids(lm, cfg.validation_rows * cfg.seq_len, cfg.seq_len, cfg.random_fraction, seed=1)
    val = val[:, :VALIDATION_LEN].to(lm.device)
    gate = random_ids(lm.vocab_size, cfg.gate_rows, VALIDATION_LEN, seed=2).to(lm.device)
    if not (with_lens or any(lm_prior_fitted(tap) for tap in taps)):  # only a gate reads past position 0
        gate = gate[:, :1]  # (fast mode's position-0 gain and screen: 128 × 19 tokens through the blocks spared)
    H_val, H_gate = observe(val), observe(gate)
    shared = (time.perf_counter() - t0) / len(taps)
    for j, tap in enumerate(taps):
        t1 = time.perf_counter()
        cal = _calibration(tap, cfg, E, models[j], tables[j], pos0[j] if fast else None, (val, H_val[j]),
                           (gate, H_gate[j]), gram0)
        models[j] = tables[j] = H_val[j] = H_gate[j] = None  # (what is left of them the calibration holds)
        if fast:
            pos0[j] = None
        cal.seconds = shared + time.perf_counter() - t1
        yield cal
        del cal  # (before the next tap's is made: one at a time)


def _calibration(tap, cfg: LearnedConfig, E: Tensor, model: dict, table: Tensor | None, pos0: dict | None,
                 validation: tuple[Tensor, Tensor], gate: tuple[Tensor, Tensor],
                 gram0: Tensor | None = None) -> Calibration:
    """One tap's Calibration after the pass: its predictions of every token from its forward model (model:
    _forward_models'), its position 0 from its table or (fast mode) its model (pos0: position0_models'; gram0: the
    Gram of the embedding rows less its mx0), the gains and screening rank chosen on the
    validation rows (ids [n, S], states [n, S, d]) and the LM or lens prior's gate placed on the random-id rows
    (gate: the same; S = 1 where neither prior reads them: fast mode's position 0 only)."""
    (val, H_val), (gate_ids, H_gate) = validation, gate
    P, P_sq = predictions(E, model["mx"], model["A"], table)  # float32 products suffice here
    if pos0 is not None:  # position 0's gain from the fresh rows' first positions (text and random ids)
        fitted = dict(pos0, p0_sq=predictions(E, pos0["mx0"], pos0["A0"])[1])  # (its norms only: position0_dots)
        H0, truth0 = torch.cat([H_val[:, 0], H_gate[:, 0]]), torch.cat([val[:, 0], gate_ids[:, 0]])
        fitted["gain0"], full0 = _position0_gain(fitted, E, H0, truth0, cfg.gains)
        first = dict(fitted, **_position0_screen(fitted, E, H0, full0, truth0, cfg, gram0), table=None, t_mean=None,
                     t_basis=None, t_proj=None)
    else:  # (P comes from the table too: stored, not made from E on load)
        del model["A"], model["mx"]
        low, high = table.aminmax()  # (NaN in, NaN out: not finite, no fit)
        fits16 = bool(low > -6e4) and bool(high < 6e4)
        first = _table_subspace(table.half() if fits16 else table, min(cfg.table_rank, table.shape[1]))
    cal = _screening(dict(model, P=P, P_sq=P_sq, **first), H_val.float(), val, cfg, tap)
    if lm_prior_fitted(tap):
        _lm_prior(cal, tap, (val, H_val), H_gate, cfg)
    if cal.lens_w is not None:
        _lens_gate(cal, tap, H_gate, cfg)
    cal.key = calibration_key(tap, cfg)
    return cal


def calibrate(tap, config: LearnedConfig | None = None) -> Calibration:
    """Fit the calibration of any tap: this package's taps as `calibrate_taps` does, any other object
    with `lm`, `dim`, `key`, `blocks_read` and `states(ids)` from its own states."""
    if hasattr(tap, "from_pass"):
        return calibrate_taps(tap.lm, [tap], config)[0]
    return next(fit_calibrations([tap], lambda ids: [tap.states(ids)], config or LearnedConfig()))


def calibrate_layers(lm, layers: list[int], config: LearnedConfig | None = None,
                     final_norm: bool = False) -> list[Calibration]:
    """Calibrations of LayerTaps at several layers, their states computed in one pass."""
    return calibrate_taps(lm, [LayerTap(lm, layer, final_norm) for layer in layers], config)


def calibrate_taps(lm, taps: list, config: LearnedConfig | None = None) -> list[Calibration]:
    """Calibrations of several taps of `lm` (states, projections, KV caches, at any layers), their
    observations computed in one forward pass (`run_taps`). All held at once: to fit many taps of a big
    model, calibrate_cached_taps saves each as it comes."""
    return list(_fitted(lm, taps, config or LearnedConfig()))


def _fitted(lm, taps: list, config: LearnedConfig) -> Iterator[Calibration]:
    """fit_calibrations of taps of `lm` from one forward pass (`run_taps`), by a copy of `lm` in the
    screening dtype where config.low_precision_states asks for it, there is no table, and that dtype is
    lower than the model's."""
    dtype = _runner_dtype(lm, config)
    runner = lm.copy_in(dtype) if dtype != lm.dtype else lm
    with_last = [*taps, LayerTap(lm, lm.depth)] if lm.n_layers == lm.depth else None  # (a cut model: no lens)
    return fit_calibrations(taps, lambda ids: [x.float() for x in run_taps(runner, taps, ids)], config,
                            (lambda ids: [x.float() for x in run_taps(runner, with_last, ids)]) if with_last else None,
                            lambda ids: [x.float() for x in run_taps(lm, taps, ids)])


def _runner_dtype(lm, config: LearnedConfig) -> torch.dtype:
    """The dtype the calibration's forward passes run in: the screening dtype in fast mode with
    low_precision_states where it is lower than the model's (a table's bounds need exact states)."""
    low = screen_dtype(lm.device)
    low_ok = config.low_precision_states and not config.has_table(lm.vocab_size)
    return low if low_ok and low.itemsize < lm.dtype.itemsize else lm.dtype


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
    """Make sure every tap's calibration is cached, fitting the missing ones in as few passes as fit in
    memory (_passes; one for a small model), each saved as soon as it is made.
    -> {tap.key: seconds spent fitting it (0 when it was cached)}"""
    config = config or LearnedConfig()
    taps = list({t.key: t for t in taps}.values())  # one fit per observed quantity
    missing = [t for t in taps if not cache_path(t, config).exists()]  # (a corrupt file is refitted on use)
    seconds = {t.key: 0.0 for t in taps}
    if not missing:
        return seconds
    passes = _passes(lm, missing, config)
    print(f"sipit: calibrating the learned policy for {lm.name} {', '.join(t.key for t in missing)} in "
          f"{'one pass' if len(passes) == 1 else f'{len(passes)} passes (to fit in memory)'} (one-time; "
          f"cached in {cache_path(missing[0], config).parent})", file=sys.stderr)
    for group in passes:
        for tap, cal in zip(group, _fitted(lm, group, config)):
            cal.save(cache_path(tap, config))
            seconds[tap.key] = cal.seconds
            del cal  # (before the next is made)
    return seconds


FIT_MEMORY = 0.6  # of the memory left (device.memory_left), what a calibration pass may take


def _passes(lm, taps: list, config: LearnedConfig) -> list[list]:
    """The taps, shallowest first, cut into consecutive groups, one fitting pass each (a pass runs the blocks
    its deepest tap reads), so that what a pass holds for every tap until it ends (_held_bytes) fits FIT_MEMORY
    of the memory left on lm's device (less the model's memory-mapped weights where the pass runs them), less
    the fast mode's copy of the model and one calibration being made (_made_bytes); a single pass where the
    memory is unknown. (An 8B model's 33 layers in fast mode hold ~1.7 GB each: 58 GB in one pass.)"""
    taps = sorted(taps, key=lambda t: t.blocks_read)
    dtype = _runner_dtype(lm, config)
    # a pass that runs the model itself needs its weights in memory: where they map a file (safetensors), they
    # sit in the page cache, which memory_left counts as free unless told; a pass that runs a copy does not
    left = memory_left(lm.device, lm.model.parameters() if dtype == lm.dtype else ())
    if left is None:
        return [taps]
    copy = 0 if dtype == lm.dtype else sum(p.numel() for p in lm.model.parameters()) * dtype.itemsize
    budget = FIT_MEMORY * left - copy - max(_made_bytes(lm, t) for t in taps)
    passes, held = [[]], 0
    for tap in taps:
        need = _held_bytes(lm, tap, config)
        if passes[-1] and held + need > budget:
            passes.append([])
            held = 0
        passes[-1].append(tap)
        held += need
    return passes


def _held_bytes(lm, tap, config: LearnedConfig) -> int:
    """Bytes a fitting pass holds for tap until it ends: the float64 sums of its forward model (features
    [E's d_model, table's dim] and context [dim] against [dim]) and of its lens, and position 0's sums (fast)
    or its table [V, dim] float32 (full)."""
    d, e, V = tap.dim, lm.embed.weight.shape[1], lm.vocab_size
    fast = not config.has_table(V)
    F = e + (0 if fast else d) + d
    forward = F * F + F * d + d * d
    position0 = (e * e + e * d + d * d) * 8 if fast else V * d * 4
    return 8 * (forward + 3 * d * d) + position0


def _made_bytes(lm, tap) -> int:
    """Bytes one calibration takes while it is made after the pass: a few [V, dim] float32 tensors
    (predictions, position 0's, projections) and the validation scores."""
    return 4 * lm.vocab_size * tap.dim * 4


def calibrate_cached_layers(lm, layers: list[int], config: LearnedConfig | None = None,
                            final_norm: bool = False) -> dict[int, float]:
    """calibrate_cached_taps for LayerTaps. -> {layer: seconds spent fitting it (0 when it was cached)}"""
    taps = [LayerTap(lm, layer, final_norm) for layer in layers]
    seconds = calibrate_cached_taps(lm, taps, config)
    return {t.layer: seconds[t.key] for t in taps}
