"""LinearRanker: the runtime side of a Calibration — top-1 guesses for every position, and full
rankings of the vocabulary on demand, re-ranked from the candidates the loop has evaluated.

Position 0: relative distance of ĥ_0 to every token's state in the table (exact for the closest
screen_top in the principal subspace, a certified lower bound for the rest); in a fast calibration
(no table) score(v) = 2 r_0·p0_v − gain0 ‖p0_v‖² with r_0 = ĥ_0 W0 − c0w (screened in p0's principal subspace
where the fit kept one, exact for the screen_top best: position0_scores), and no bounds; an observation within the
radius of a kept exact first-token state (the calibration text's most frequent tokens) guesses its token (first_tokens).
Position t ≥ 1: score(v) = 2 r_t·P_v − gain ‖P_v‖² with the context residual
r_t = ĥ_t W − ĥ_{t−1} Bw − cw, plus, at the last layer for text-like prompts, 2·lm_weight·log p_LM(v | ĥ_{t−1});
below it, the guesses of text-like prompts re-ranked with the LM head read through a lens (lens_guesses).
"""
from __future__ import annotations

import itertools
import warnings
from functools import cached_property

import torch
from torch import Tensor

from ...models.device import screen_dtype
from .cache import Calibration

STORE_ERR = {torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}  # relative rounding of the stored table
EXACT_TOP = 1024  # tokens per search ranking scored exactly after the low-rank screen (token_scores)
SCREEN_ROWS = 128  # residuals per screening product: a [608, V] screen (32 prompts of 20 tokens) in one
#                    product took 2.7x as long as in blocks of 128, whose [128, V] temporaries stay in cache


def against(x: Tensor, table: Tensor) -> Tensor:
    """x [n, k] against every row of table [V, k]: x @ tableᵀ, [n, V]. For 2-16 rows in float32 computed as
    (table @ xᵀ)ᵀ: with MKL on this project's AVX2-only AMD CPU (2 threads, V = 49,152, k = 131) that took
    2.3-5.5 ms where x @ tableᵀ took 6-17 ms (a search's first ranking, the revisions after a miss);
    at 64 rows and more it is the slower one (a lock-step batch's guesses). On an Intel Xeon with AMX it is the
    other way round (2 rows, k = 576: 11 vs 3.7 ms), left so: such products are under 2% of a layer-30 lock-step
    batch there (docs/results/invert/README.md)."""
    if x.dtype == torch.float32 and 2 <= len(x) <= 16:
        return (table @ x.T).T.contiguous()
    return x @ table.T


TOP_GROUP = 16  # columns per group of top_rows' first stage (16 and 64 alike for k = 16-64 on an Intel Xeon, 16
#                twice as fast for a search batch's 256 of one row, where 64 falls back to topk: top_rows_cost.py)


def top_rows(x: Tensor, k: int, largest: bool = True) -> Tensor:
    """The indices [n, k] of each row's k largest (largest=False: smallest) entries of x [n, V], best first, as
    torch.topk finds them (ties may come in another order). Where k is small against V, in two stages: the best
    of each group of TOP_GROUP columns (column c in group c mod m, m = V // TOP_GROUP: an element-wise max of
    TOP_GROUP rows of m, which vectorises, bfloat16 too), the k best groups, then the k best of their
    k·TOP_GROUP entries (and of the last V mod TOP_GROUP columns): a row's k best lie in the k groups whose
    bests are best. torch.topk does not vectorise a small k over a long row: on an Intel Xeon with AMX (2
    threads) it took 1.2-1.5 ms of a one-prompt guess's [19, 49,152] screen and 8-10 ms of a [128, 49,152] block
    of a lock-step batch's, 2-4x what this takes (docs/results/invert/top_rows_cost.py). 1-D x: [k]."""
    if x.dim() == 1:
        return top_rows(x[None], k, largest)[0]
    n, V = x.shape
    m = V // TOP_GROUP
    if k * 4 > m:
        return x.topk(k, dim=1, largest=largest).indices
    groups = x[:, :m * TOP_GROUP].view(n, TOP_GROUP, m)
    best = (groups.amax(1) if largest else groups.amin(1)).topk(k, dim=1, largest=largest).indices  # [n, k]
    cols = (best[:, :, None] + m * torch.arange(TOP_GROUP, device=x.device)).flatten(1)  # [n, k·TOP_GROUP]
    if m * TOP_GROUP < V:
        cols = torch.cat([cols, torch.arange(m * TOP_GROUP, V, device=x.device).expand(n, -1)], 1)
    return cols.gather(1, x.gather(1, cols).topk(k, dim=1, largest=largest).indices)


def position0_dots(r0: Tensor, A0: Tensor, mx0: Tensor, E: Tensor) -> Tensor:
    """r0 [B, d] · p0_v for every token v, p0_v = (e_v − mx0) A0 its whitened position-0 prediction (fast mode),
    as (r0 A0ᵀ)·(e_v − mx0) from the embedding rows E [V, e]: p0 [V, d] is never made (Qwen2.5-1.5B: a 933 MB
    product that took about a third of a fast calibration's load). [B, V]"""
    q = r0.float() @ A0.T  # [B, e]
    return against(q, E).sub_(q @ mx0[:E.shape[1]].float()[:, None])


def position0_full(r0: Tensor, cal: Calibration, E: Tensor) -> Tensor:
    """Fast mode, position 0: 2 r0·p0_v − gain0‖p0_v‖² of every token v for residuals r0 [B, d], through the whole
    embedding E [V, e]. [B, V]"""
    return 2 * position0_dots(r0, cal.A0, cal.mx0, E) - cal.gain0 * cal.p0_sq


def position0_scores(r0: Tensor, cal: Calibration, E: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Fast mode, position 0: residuals r0 [B, d] -> (guesses [B], an order key [B, V]: ascending = best first).
    score(v) = 2 r0·p0_v − gain0‖p0_v‖²: through the whole embedding E [V, e] (position0_dots), or where the
    calibration has a screen (p0_basis) scored in p0's principal subspace, 2 (r0 U)·p0_v U − gain0‖p0_v U‖², its m
    best exactly from their embedding rows, those first: a [V, k0] read instead of [V, e] (Gemma-3-270M layer 1, k0 =
    32 of 640: median ratio to the forward 8.94 → 4.48, position0_screen_ab.py; the fit chooses k0, _position0_screen)."""
    if cal.p0_basis is None:
        score = position0_full(r0, cal, E)  # [B, V]
        return score.argmax(1), score.neg_()
    key = against(r0 @ cal.p0_basis, cal.p0_proj).mul_(-2).add_(cal.p0_proj_sq, alpha=cal.gain0)  # [B, V]: −screened
    top = top_rows(key, min(m, key.shape[1]), largest=False)  # [B, m]
    exact = position0_exact(r0, cal, E, top)
    order = top.gather(1, exact.sort(dim=1, descending=True, stable=True).indices)  # [B, m]: best first
    first = key.min(1, keepdim=True).values - len(order[0]) + torch.arange(len(order[0]), device=key.device)
    return order[:, 0], key.scatter_(1, order, first)  # (the m best before every other token)


def position0_exact(r0: Tensor, cal, E: Tensor, top: Tensor) -> Tensor:
    """Fast mode, position 0: 2 r0·p0_v − gain0‖p0_v‖² exactly, from their embedding rows, for the tokens top [B, m]
    of residuals r0 [B, d] (cal: A0, mx0, gain0, p0_sq). [B, m]"""
    F = cal.A0.shape[0]
    rows = (E.index_select(0, top.flatten()) - cal.mx0[:F].float()).view(*top.shape, F) @ cal.A0  # [B, m, d]
    return 2 * (rows @ r0[:, :, None])[..., 0] - cal.gain0 * cal.p0_sq[top]


def squared_norms(rows: Tensor, block: int = 4096) -> Tensor:
    """‖row‖² of every row of rows [V, k] in float64, a block of rows at a time (Qwen2.5-1.5B's [151,936, 512]
    screen: 0.46 s squaring a float64 copy of the whole, 0.07 s in blocks that stay in cache; the same numbers).
    rows is not changed, whatever its dtype. [V] float64"""
    out = torch.empty(len(rows), dtype=torch.float64, device=rows.device)
    for start in range(0, len(rows), block):
        out[start:start + block] = rows[start:start + block].to(torch.float64, copy=True).square_().sum(1)
    return out


def squared_distances(x: Tensor, rows: Tensor, rows_sq: Tensor) -> Tensor:
    """‖x_i − row_j‖² of x [n, d] against rows [m, d] float64 with their squared norms rows_sq [m], in float64 from
    one product (float32 would lose the few digits in which position-0 states with massive activations differ;
    torch.cdist took 0.9 ms for one row of Gemma-3's 1,028 kept first tokens, this 0.1). [n, m]"""
    x = x.double()
    return squared_norms(x)[:, None] + rows_sq - 2 * x @ rows.T


def row_dots(table: Tensor, ids: Tensor, x: Tensor, rows: int = 16) -> Tensor:
    """table[ids[i, j]] · x[i] for ids [n, m] and x [n, k]: [n, m]. On a CPU in float32, the product x @ tableᵀ at
    those (i, ids[i, j]) entries only (torch.sparse.sampled_addmm: each a dot product read straight off the table's
    row, no gathered copy; on an Intel Xeon with AMX, 2 threads, SmolLM2's P [49,152, 576] at layer 15: a lock-step
    batch's 608 × 64 13.6 → 4.9 ms, a prompt's 19 × 16 0.19 → 0.10 ms, and nearer float64's: 2.5e-5 against 5.6e-5 at
    most; docs/results/invert/row_dots_ab.py). Elsewhere gathered by index_select in blocks of `rows`, so that each
    [rows, m, k] block is read back from cache (twice as fast as table[ids])."""
    if not len(ids):
        return x.new_zeros(ids.shape)
    if table.device.type == "cpu" and table.dtype == x.dtype == torch.float32:
        n, m = ids.shape
        with warnings.catch_warnings():  # (CSR tensors' "beta" notice, once a process)
            warnings.simplefilter("ignore")
            entries = torch.sparse_csr_tensor(torch.arange(0, n * m + 1, m), ids.reshape(-1), x.new_zeros(n * m),
                                              size=(n, len(table)), check_invariants=False)
            return torch.sparse.sampled_addmm(entries, x, table.T, beta=0.0).values().view(n, m)
    k = table.shape[1]
    return torch.cat([(table.index_select(0, i.reshape(-1)).view(*i.shape, k) @ v[:, :, None])[..., 0]
                      for i, v in zip(ids.split(rows), x.split(rows))])


class LinearRanker:
    def __init__(self, cal: Calibration, tap, screen_top: int = 64, low: torch.dtype | None = None,
                 guess_top: int = 16):
        """tap: what the calibration observed (its LM's head and final norm serve the LM prior); screen_top:
        the candidates position 0 and a search's first ranking score exactly, guess_top: those the guesses at
        t ≥ 1 do (LearnedConfig); low: the screens' dtype (default: models.device.screen_dtype; fitting passes
        float32, so a calibration never depends on the hardware that fitted it)."""
        self.cal, self.lm, self.final_norm = cal, tap.lm, getattr(tap, "final_norm", False)
        self.scored = 0  # (position, token) pairs scored so far, for the bench: every token for each position of
        #                  a screen, ranking or LM score
        self.screen_top, self.guess_top = screen_top, guess_top
        if cal.table is not None:
            self.table_err = STORE_ERR[cal.table.dtype] + 1e-5  # storage rounding + batched-pass noise
            # [k, V] row-major: a product with few rows reads it 3x faster than t_proj.T's strided
            # view (one prompt, SmolLM2, k = 128: 4.3 -> 1.4 ms on this project's 2-core CPU)
            k, self.t_basis, t_proj = cal.t_proj.shape[1], cal.t_basis, cal.t_proj  # k, [d, k], [V, k]
            self.t_proj_T = t_proj.T.contiguous()
            # position 0's squared distances in the subspace, in float32 less a slack that covers its
            # rounding: a·(‖p_v‖² + ‖q‖²) for the [k]-long products and the sums (+ t_proj's storage),
            # so d² − slack = (1 − a)‖p_v‖² − b + (1 − a)‖q‖² − 2 q·p_v, the per-token part kept here
            t_sq = squared_norms(t_proj)  # [V]
            self.t_keep = 1 - (3 * k + 8) * 2.0 ** -24
            self.t_lower = (self.t_keep * t_sq - 1e-6 * t_sq.mean()).float()  # [V]
        self.unembed = None  # the LM head's rows [V, d] float32, for the LM and lens priors (use_head)
        self.gain = cal.gain
        # the screens in the screening dtype (bfloat16 where native: 3x faster, and only orders candidates;
        # exact scores, position 0's bounds and the LM gate stay float32)
        self.low = low or screen_dtype(cal.P.device)
        self.use_screen()
        self.use_head()

    def use_screen(self) -> None:
        """The guesses' screen from the calibration's P subspace (p_basis, p_proj); a fit that tries ranks sets them
        and calls this again on one ranker (the rest of a ranker does not depend on them)."""
        cal = self.cal
        self.exact_screen = cal.p_basis.shape[1] == cal.P.shape[1]  # full rank: screens score exactly
        # the guesses' screens, one product each with the bias folded in: [x·B, (w/2g)·n·U, −1, −1, −c] against
        # [P_v B, U_v B, hi_v, lo_v, 1] with hi + lo = (g/2)‖P_v B‖² (two columns: to ~2⁻¹⁸ in bfloat16) and c a
        # per-row shift that puts the best scores near 0 (the product accumulates in float32 and rounds its
        # output: near 0 that rounding is small), so the [n, V] scores leave the product in the screening
        # dtype: no float32 copy, no pass to add the bias (Gemma-3, V = 262,144: the copy cost more than the
        # bfloat16 product)
        # The screens score the projected distance ‖Π(r/g − P_v)‖², with ‖ΠP_v‖² (p_sq) rather than ‖P_v‖²:
        # subtracting the full norm while the product sees only r's projection penalises the true token by its
        # unseen part g‖Π⊥P_v‖² (SmolLM2 layer 1, the seed-5 bench prompts, rank 64: the exact top-1 was in that
        # screen's 64 best at 324 of 760 positions, in this one's best 1 at all 760)
        self.p_sq = squared_norms(cal.p_proj).float()  # [V]
        half_sq = (self.gain / 2) * self.p_sq.double()
        hi = half_sq.to(self.low)
        bias = torch.stack([hi, (half_sq - hi.double()).to(self.low), torch.ones_like(hi)], 1)  # [V, 3]
        proj = cal.p_proj.to(self.low)
        self.screen_table = torch.cat([proj, bias], 1)  # [V, r + 3]
        self.p_proj_low = self.screen_table[:, :proj.shape[1]]  # a view: token_scores' screen (its gain varies)

    def use_head(self) -> None:
        """The LM head's rows for the priors and its screen from the calibration (u_basis, u_proj): its subspace's
        rows [V, k], at full rank (u_proj not stored) the head's own; a fit that tries ranks sets them and calls this
        again."""
        cal = self.cal
        if self.unembed is None and (cal.has_prior or cal.lens_w is not None):
            self.unembed = self.lm.unembedding_rows().float()
        u_proj = cal.u_proj if cal.u_proj is not None else self.unembed
        self.head_low = u_proj.to(self.low) if cal.has_prior else None

    @cached_property
    def E(self) -> Tensor:
        """The embedding rows [V, e] in float32: position 0's scores without a table (position0_dots); made at the
        first such score, never for the rankers a fit measures with."""
        return self.lm.embedding_rows().float()

    def _count(self, positions: int) -> None:
        self.scored += positions * self.cal.P.shape[0]

    def position0(self, Y: Tensor, eps: float | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Y [B, d]: position 0 of B prompts -> (guesses [B], an order key [B, V]: ascending = best
        first, certified lower bounds of the true relative distances [B, V] or None). With the table
        the key is the relative distance (exact for a screened few, else a lower bound); without it,
        minus the score. eps: the loop's acceptance threshold, where known (first_tokens)."""
        c = self.cal
        self._count(len(Y))
        if c.table is None:
            guesses, key = position0_scores(Y.float() @ c.white0 - c.c0w, c, self.E, self.screen_top)
            return *self.first_tokens(Y, guesses, key, eps), None
        q = (Y.double() - c.t_mean.double()).float() @ self.t_basis  # [B, k]
        q_sq = (q.double() ** 2).sum(1, keepdim=True)  # [B, 1]
        # ‖Π(x_v − y)‖² ≤ ‖x_v − y‖², less the slack: one fused float32 product, then in place  [B, V]
        dist = (self.t_lower + (self.t_keep * q_sq).float()).addmm_(q, self.t_proj_T, alpha=-2).clamp_min_(0).sqrt_()
        top = top_rows(dist, min(self.screen_top, dist.shape[1]), largest=False)  # [B, m]
        rows = c.table.index_select(0, top.flatten()).view(*top.shape, -1)  # [B, m, d] (as row_dots)
        exact = (rows.double() - Y.double()[:, None]).norm(dim=2)  # [B, m]
        rel = dist.scatter_(1, top, exact.float()).div_(Y.double().norm(dim=1, keepdim=True).clamp_min(1e-30).float())
        # ‖x̃ − x‖ ≤ e‖x‖ ≤ e(‖ĥ‖ + ‖x − ĥ‖)  =>  d ≥ (d̃ − e)/(1 + e); d̃ ≥ rel·(1 − 2⁻²¹): float32 roundings
        e = self.table_err
        bounds = rel.mul((1 - 2.0 ** -21) / (1 + e)).sub_(e / (1 + e)).clamp_min_(0)
        return top.gather(1, exact.argmin(1, keepdim=True))[:, 0], rel, bounds

    def first_tokens(self, Y: Tensor, guesses: Tensor, key: Tensor, eps: float | None = None) -> tuple[Tensor, Tensor]:
        """Fast mode: where an observation Y [B, d] lies within a kept first-token state's radius (Calibration.first_rows),
        and within eps of it (relative to ‖y‖, as the loop accepts a token) where given, that token is its guess and
        first in its key (guesses [B], key [B, V]: position0_scores', changed in place). The tokens text starts with most
        are those the linear model misses (held-out first tokens of six sources, fresh seed 883, wrong without → with
        them: SmolLM2 layer 15 265 → 15 of 1,200, Gemma-3-270M layer 9 171 → 24, where a newline had ranked 170,877th:
        first_token_fast.py). The radius alone makes a kept state the nearest kept one, not the truth: another token's
        state can lie inside (Qwen2.5-1.5B layer 14: a random id, `]]:` and a newline, in the radius of `]:` and a
        newline at 95% of it, 0.5% of its norm), where a kept token's own observation lies within its noise."""
        c = self.cal
        if c.first_ids is None:  # (files saved before they were kept)
            return guesses, key
        near, j = squared_distances(Y, *self.first_rows).min(1)  # [B]
        within = c.first_radius[j].double() ** 2
        if eps is not None:
            within = within.minimum(eps ** 2 * squared_norms(Y))
        hit = (near < within).nonzero()[:, 0]
        if len(hit):
            ids = c.first_ids[j[hit]]
            guesses[hit] = ids
            key[hit, ids] = key[hit].min(1).values - 1
        return guesses, key

    @cached_property
    def first_rows(self) -> tuple[Tensor, Tensor]:
        """The kept first-token states in float64 [n, d] and their squared norms [n], once (squared_distances)."""
        rows = self.cal.first_rows.double()
        return rows, squared_norms(rows)

    def position0_order(self, y: Tensor, key: Tensor) -> Tensor:
        """The order of a search at position 0 (y [d]: the observed state, key [V]: position0's). With a table, that
        key. In a fast calibration every token's full score (where its screen valued all but its best in its
        subspace only: read when a search needs it; SmolLM2, fresh seed 859: a missed first token ranked 123rd by
        the screen's order at layer 15, 2nd by the full scores). (The tokenizer's special tokens, whose states the
        linear model does not predict, are among the kept first tokens: first_tokens.) Ids [V], best first."""
        c = self.cal
        if c.table is not None or c.p0_basis is None:
            return key.argsort()
        return position0_full(y[None].float() @ c.white0 - c.c0w, c, self.E)[0].neg_().argsort()

    def context_residuals(self, *targets: Tensor) -> Tensor:
        """Whitened observations minus the predicted context part, positions 1..T_i-1 of each target
        [T_i, d], all in one product (a lock-step batch's 32 prompts: 34 small products took 15 ms at
        layer 1). -> [Σ(T_i-1), d]"""
        c = self.cal
        return torch.cat([t[1:] for t in targets]) @ c.white - torch.cat([t[:-1] for t in targets]) @ c.Bw - c.cw

    def normed(self, h: Tensor) -> Tensor:
        """States h [..., d] as the LM head reads them: through the final norm unless the tap observes them normed."""
        return h if self.final_norm else self.lm.norm(h)

    def _biased_screen(self, parts: list[Tensor], table: Tensor) -> Tensor:
        """Half the screened score, x·B·(P_v B) [+ (w/2g)·n·U·(U_v B)] − (g/2)‖P_v B‖², of every token less a
        per-row constant (‖x·B‖²/2g: the best near 0), in one product: parts [n, ·] (the projected residuals,
        then the prior's part) against table [V, ·]. [n, V] in the screening dtype (orders only)."""
        x = parts[0]
        shift = -(x.double() ** 2).sum(1, keepdim=True).float() / (2 * self.gain)
        x = torch.cat([*parts, x.new_full((len(x), 2), -1.0), shift], 1)
        return against(x.to(self.low), table)

    def exact_scores(self, top: Tensor, r: Tensor, g) -> Tensor:
        """2 r·P_v − g‖P_v‖², exactly, for the candidates top [n, m] of residuals r [n, d] (g: a float or [n, 1]). [n, m]"""
        return 2 * row_dots(self.cal.P, top, r) - g * self.cal.P_sq[top]

    def screen(self, r: Tensor) -> Tensor:
        """Top-1 by the screened scores: context residuals r [n, d] -> ids [n]."""
        return self.screen_best(r)[0][:, 0]

    def screen_best(self, r: Tensor, approx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The screen's best, exactly scored: context residuals r [n, d] -> (ids [n, m], scores
        2 r·P_v − g‖P_v‖² [n, m], best first): the guess_top best of the low-rank screen (approx: its [n, V]
        scores if made already, _prior_screens), or of a full-rank one (screen_top with a lens)."""
        c = self.cal
        if len(r) > SCREEN_ROWS:
            parts = [self.screen_best(r[i:i + SCREEN_ROWS]) for i in range(0, len(r), SCREEN_ROWS)]
            return torch.cat([i for i, _ in parts]), torch.cat([v for _, v in parts])
        self._count(len(r))
        # (with a lens, its text score and re-ranking read the screen_top best: fewer compress the score's
        # scale and its gate, calibrated on random ids, then shuts the lens off for text)
        m = min(self.screen_top if c.lens_w is not None else self.guess_top, len(c.P))
        if self.exact_screen:  # half the score, r·P_v − (g/2)‖P_v‖², orders alike
            half = against(r, c.P).sub_(c.P_sq, alpha=self.gain / 2)
            top = top_rows(half, m)
            return top, 2 * half.gather(1, top)
        if approx is None:
            approx = self._biased_screen([r @ c.p_basis], self.screen_table)  # [n, V]
        top = top_rows(approx, m)  # [n, m]
        exact = self.exact_scores(top, r, self.gain)  # [n, m]
        best = exact.sort(dim=1, descending=True, stable=True)
        return top.gather(1, best.indices), best.values

    def lens_logits(self, previous: Tensor, ids: Tensor) -> Tensor:
        """The LM head's logits of ids [n, m] after the observed states previous [n, d], read through the
        calibration's lens (the tap's state translated to the last layer's, then normed). [n, m]"""
        c = self.cal
        n = self.lm.norm(previous.float() @ c.lens_w + c.lens_b).float()  # [n, d]
        return row_dots(self.unembed, ids, n)

    def lens_text_score(self, logits: Tensor) -> float:
        """How text-like a prompt reads through the lens, from its positions' logits [n, m] of the screen's
        best (the guess first): the mean log-probability of the guess among them. Random ids score low."""
        return float((logits[:, 0] - logits.logsumexp(1)).mean())

    def lens_guesses(self, targets: list[Tensor], top: Tensor, scores: Tensor) -> list[Tensor]:
        """Below the last layer, with a lens (Calibration.lens_w): per prompt (targets: [T_i, d]; top, scores
        [Σ(T_i-1), m]: screen_best of its positions 1..T_i-1) the screen's best re-ranked by
        score + 2·lm_weight·(the lens logit) where the prompt reads as text (lens_text_score above the
        calibration's lens_gate), else the plain top-1. Only the screen's best m are re-ranked (the lens
        logits' normaliser is the same for all of a position's tokens). SmolLM2 ℓ = 15, full calibration, the
        bench prompts (760 positions each): wrong first guesses 45 -> 36 on seed 5 (where the weight was kept:
        lm_weight, the last layer's), held out 35 -> 25, 37 -> 24, 39 -> 30, 32 -> 28, 38 -> 35 (seeds 1, 7,
        13, 17, 23); a miss costs a pass (~a forward). -> ids [T_i-1] each"""
        sizes = [len(t) - 1 for t in targets]
        if self.cal.lens_w is None or top.shape[1] < 2:
            return list(top[:, 0].split(sizes))
        logits = self.lens_logits(torch.cat([t[:-1] for t in targets]), top)  # [N, m]
        out = []
        for i, s, v, lg in zip(sizes, top.split(sizes), scores.split(sizes), logits.split(sizes)):
            on = i > 0 and self.lens_text_score(lg) > self.cal.lens_gate
            out.append(s.gather(1, (v + 2 * self.cal.lm_weight * lg).argmax(1, keepdim=True))[:, 0] if on else s[:, 0])
        return out

    def _prior_screens(self, r: Tensor, n: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The screens of residuals r [n, d] whose normed previous states are n [n, d], one product over the
        vocabulary each: the plain screen and the LM head's logits (in its screen's subspace). -> (the plain screen's
        best [n, guess_top], best first, the plain top-1's LM log-prob [n], the screen_top best by 2 ×
        log-likelihood + w · log p_LM [n, m]). The head's logits serve both the gate (log p_LM of the plain guesses)
        and the prior's screen: it reads the whole head where the fit chose it (SmolLM2 layer 30: a rank-128 screen
        dropped the tokens the LM ranks first, code's most), for about what a prior screen of rank 128 and the gate's
        cost apart."""
        c = self.cal
        self._count(len(r))
        approx = self._biased_screen([r @ c.p_basis], self.screen_table)  # [n, V]: score ÷ 2g less a constant
        logits = against((n @ c.u_basis).to(self.low), self.head_low).float()  # [n, V]
        plain = self.screen_best(r, approx)[0]
        logp = (n * self.unembed[plain[:, 0]]).sum(1) - logits.logsumexp(1)
        best = top_rows(logits.mul_(c.lm_weight / self.gain).add_(approx), min(self.screen_top, logits.shape[1]))
        return plain, logp, best

    def prior_screens(self, r: Tensor, n: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """_prior_screens of any number of rows, SCREEN_ROWS at a time.
        -> (plain [n, guess_top], log p [n], best [n, m])"""
        parts = [self._prior_screens(r[i:i + SCREEN_ROWS], n[i:i + SCREEN_ROWS])
                 for i in range(0, max(len(r), 1), SCREEN_ROWS)]  # (no rows: one empty part)
        return tuple(torch.cat(x) for x in zip(*parts))

    def pick(self, best: Tensor, r: Tensor, n: Tensor | None = None) -> Tensor:
        """Top-1 of the candidates best [n, m] by 2 × log-likelihood −‖r − g·P_v‖², + w · log p_LM(v) where the
        normed previous states n [n, d] are given (the LM prior), exactly: residuals r [n, d] -> ids [n]"""
        g = self.gain
        exact = g * self.exact_scores(best, r, g)
        if n is not None:
            exact += 2 * self.cal.lm_weight * row_dots(self.unembed, best, n)
        return best.gather(1, exact.argmax(1, keepdim=True))[:, 0]

    def screen_prior(self, r: Tensor, n: Tensor) -> Tensor:
        """Top-1 with the LM prior: residuals r [m, d] and the normed previous states n [m, d] -> ids [m];
        screened, then exact for the screen_top best."""
        return self.pick(self.prior_screens(r, n)[2], r, n)

    def revised(self, items: list[tuple]) -> list[Tensor]:
        """New top-1 guesses for positions t..t+k-1 (t ≥ 1) of many revisions at once, each (target [T, d],
        t, guessed ids [k], their states [k, d] computed after a wrong token earlier in the sequence, prior,
        shortlist [k, m]: the candidates the first guesses there were picked from, first_look): not exact, but
        each is its position's state of its guess in a context one token off, so as a one-anchor re-ranking (the
        anchored residual W ĥ_s − W h_s(g_s) + gain·P_{g_s}) it corrects the context part. Scored exactly, the
        shortlist only: the anchor moves the context, and the truth of a guess it corrects was mostly among them
        already (SmolLM2 layer 30, fresh seeds 773 / 809: 1,438 of 1,482 and 1,565 of 1,622 revised positions the
        same top-1 as re-ranking the whole vocabulary, right 1,198 / 1,323 against 1,194 / 1,307:
        revision_agreement.py), with no product over the vocabulary (those took about 7% of a prompt's time there).
        The prompts of a lock-step batch settle theirs together (Learned.settle_many). -> ids [k] per revision"""
        c = self.cal
        out: list = [None] * len(items)
        for prior in (False, True):
            which = [i for i, item in enumerate(items) if item[4] == prior]
            if not which:
                continue
            sel = [items[i] for i in which]
            r = torch.cat([(target[t:t + len(ids)].float() - states.float()) @ c.white + self.gain * c.P[ids]
                           for target, t, ids, states, _, _ in sel])  # [Σk, d]
            n = (torch.cat([self.normed(target[t - 1:t + len(ids) - 1]).float() for target, t, ids, *_ in sel])
                 if prior else None)  # [Σk, d]: the prior's normed previous states
            top = self.pick(torch.cat([item[5] for item in sel]), r, n)  # (the shortlists [Σk, m])
            for i, ids in zip(which, top.split([len(item[2]) for item in sel])):
                out[i] = ids
        return out

    def guesses(self, targets: list[Tensor]) -> list[tuple[Tensor, bool]]:
        """first_look without the shortlists: per prompt (top-1 guesses [T_i-1], whether the LM prior is on)."""
        return [(ids, prior) for ids, prior, _ in self.first_look(targets)]

    def first_look(self, targets: list[Tensor]) -> list[tuple[Tensor, bool, Tensor]]:
        """Per prompt (targets: list of [T_i, d]): (top-1 guesses for positions 1..T_i-1 [T_i-1],
        whether the LM prior is on: the mean LM log-prob of its plain guesses above the calibration's gate,
        the shortlist each guess was picked from [T_i-1, m], best first: what a revision re-ranks).
        The products of every prompt are done together: on a CPU a product with few rows is bound by
        reading the [V, r] screen, so B prompts at once cost about what one does (lock-step inversion)."""
        c = self.cal
        sizes = [len(t) - 1 for t in targets]
        r = self.context_residuals(*targets)  # [N, d]
        if not c.has_prior:
            top, scores = self.screen_best(r)
            return [(p, False, s) for p, s in zip(self.lens_guesses(targets, top, scores), top.split(sizes))]
        n = self.normed(torch.cat([t[:-1] for t in targets])).float()  # [N, d]
        plain, logp, best = self.prior_screens(r, n)
        on = [len(lp) > 0 and float(lp.mean()) > c.lm_gate for lp in logp.split(sizes)]
        rows = torch.tensor(on).repeat_interleave(torch.tensor(sizes))  # [N]
        ids = plain[:, 0].clone()
        if rows.any():
            ids[rows] = self.pick(best[rows], r[rows], n[rows])
        return [(g, prior, b if prior else p)
                for g, prior, b, p in zip(ids.split(sizes), on, best.split(sizes), plain.split(sizes))]

    def anchored_residual(self, target: Tensor, t: int, anchors=None) -> tuple[Tensor, float]:
        """(y, s): position t's whitened observation with the context part removed, and the gain of
        the token part, so that score(v) = −‖y − s·P_v‖².

        Without anchors the context is predicted from ĥ_{t−1} (s = the calibrated gain). With
        anchors — candidates u already evaluated at t, ids [n] and exact states [n, d] on the
        verified prefix — it is measured: W h_t(u) ≈ b + s·P_u by least squares over the anchors
        (one anchor: s = the calibrated gain), and y = W ĥ_t − b. At deep layers the token's effect
        shrinks in context (s < 1) and the fitted offset beats the predicted one: SmolLM2 ℓ = 30,
        positions missed by the first 16 candidates, the true token's median rank among the rest is
        1 (fit) vs 28 (one anchor) vs 66 (none)."""
        c = self.cal
        if anchors is None or len(anchors[0]) == 0:
            return self.context_residuals(target[t - 1:t + 1])[0], self.gain
        ids, states = anchors
        Y, X = states.float() @ c.white, c.P[ids]  # [n, d] each
        s = self.gain
        if len(ids) > 1:
            Xc, Yc = X - X.mean(0), Y - Y.mean(0)
            fit = float((Xc * Yc).sum() / (Xc * Xc).sum().clamp_min(1e-30))
            s = fit if 0.05 < fit < 20 else s  # degenerate fits (all anchors alike) keep the gain
        return target[t].float() @ c.white - (Y.mean(0) - s * X.mean(0)), s

    def scores(self, target: Tensor, t: int, prior: bool, anchors=None) -> Tensor:
        """Scores of every token at position t ≥ 1 (exact for the best, token_scores): 2 × log-likelihood
        (+ the LM prior). [V]"""
        return self.scores_many([(target, t, prior, anchors)])[0]

    def scores_many(self, requests: list[tuple], exact_top: int | None = None) -> Tensor:
        """`scores` of many (target, t, prior, anchors) at once: one product over the screen for all
        (and one over the LM head for those with the prior), where each alone reads the whole table
        for one row (Learned.settle_many: the first ranking of every search of a lock-step round). [n, V]"""
        ys, gains = zip(*(self.anchored_residual(target, t, anchors) for target, t, _, anchors in requests))
        s = self.token_scores(torch.stack(ys), torch.tensor(gains), exact_top)
        on = [i for i, (_, _, prior, _) in enumerate(requests) if prior]
        if on:
            normed = self.normed(torch.stack([requests[i][0][requests[i][1] - 1] for i in on])).float()
            self._count(len(on))
            s[on] += 2 * self.cal.lm_weight * against(normed, self.unembed)
        return s

    def token_scores(self, Y: Tensor, g: Tensor, exact_top: int | None = None) -> Tensor:
        """2g·P_v·y − g²‖P_v‖² of every token v for residuals Y [n, d] with gains g [n]: exactly for each row's
        exact_top (default EXACT_TOP) best by the screen in P's principal subspace, estimated there for the rest. A
        full-rank screen is exact already. Reading the [V, r] screen instead of the [V, d] P is what a search batch's
        ranking costs (SmolLM2 ℓ = 15: r = 64 of d = 576); rankings are read no deeper than EXACT_TOP before
        the loop's last batches. [n, V]"""
        c = self.cal
        self._count(len(Y))
        g = g.float()[:, None].to(Y.device)  # [n, 1]
        if self.exact_screen:
            return against(Y, c.P).mul_(2 * g).sub_(g * g * c.P_sq)
        dots = against((Y.float() @ c.p_basis).to(self.low), self.p_proj_low).float().mul_(2 * g)  # [n, V]
        # the best by the projected distance (as the guesses' screen), the rest valued as if y had no part outside
        # the subspace: 2g·ΠP_v·Πy − g²‖P_v‖², which for a token unrelated to y estimates the exact score, where
        # the projected distance's −g²‖ΠP_v‖² overrates them all by g²‖Π⊥P_v‖² (an upper bound, +‖Π⊥y‖², put
        # every screened token before the exact ones: SmolLM2 layer 15, searches of ~10⁴ tokens)
        m = min(exact_top or EXACT_TOP, dots.shape[1])
        top = top_rows(dots - g * g * self.p_sq, m)  # [n, m]
        s = dots.sub_(g * g * c.P_sq)
        exact = g * self.exact_scores(top, Y, g)
        return s.scatter_(1, top, exact)

    def ranking(self, target: Tensor, t: int, prior: bool, sizes, anchors, prefix_lm=lambda: None, first=None):
        """Candidate batches for position t ≥ 1, best first, re-ranked before every batch from the
        candidates evaluated so far: anchors() -> (ids [n], states [n, d]), growing as the loop
        observes. A deep layer's ranker has heavy tails that are not always the same ranker's, so
        3/4 of each batch follow the main ranker (anchored, prior as gated) and 1/4 another: in the
        first batch the most different one (no anchors, prior flipped), from the second on the linear
        model alone without its norm term (free_scores: the main scores' −g²‖P_v‖² buries tokens whose
        predictions are long; SmolLM2 layer 30, nine truths the main scores ranked 535th to 49,146th:
        0–67th at five, 373–1,605th at three, one lower, 1,979 → 7,420; docs/results/invert/README.md).
        On text, from the third batch on — the main
        ranker has missed its first ones — a quarter of the main share goes to the LM's own
        next-token ranking alone: the linear model can misplace a token the LM predicts
        (Qwen2.5-Coder-1.5B, last layer, fast calibration: a code token ranked 29,049th by the main
        scores was the LM's 7th). With the prior on, that ranking is read off the observed ĥ_{t−1};
        otherwise prefix_lm() gives it (the LM run on the verified prefix, for surfaces and layers
        without a prior), or None where the prefix does not read as text.
        sizes: batch sizes, the last one repeated; first: the first batch's (main, other) scores
        [V] each if computed already (first_scores)."""
        V = self.cal.P.shape[0]
        given = torch.zeros(V, dtype=torch.bool, device=self.cal.P.device)
        lm_ranking = None  # the LM's next-token scores [V], asked for at the third batch
        memo = {}  # what every batch would compute alike: the LM head's logits at t, the norm-free scores

        def once(key, compute):
            if key not in memo:
                memo[key] = compute()
            return memo[key]

        def scored(seen) -> Tensor:  # scores(target, t, prior, seen), the LM head read once
            s = self.scores(target, t, False, seen)
            return s.add_(once("head", lambda: self.lm_scores(target, t)), alpha=2 * self.cal.lm_weight) if prior else s

        def free() -> Tensor:  # free_scores(target, t), once (no anchors: the same for every batch)
            return once("free", lambda: self.free_scores(target, t))

        for k, size in enumerate(itertools.chain(sizes, itertools.repeat(sizes[-1]))):
            left = int((~given).sum())
            if left == 0:
                return
            size = min(size, left)
            seen = anchors()
            if k == 0:
                main, alt = first if first is not None else self.first_scores([(target, t, prior, seen)])[0]
            else:
                main, alt = scored(seen), None
            main = main.masked_fill(given, -float("inf"))
            n_alt = size // 4 if (k > 0 or self.cal.has_prior or len(seen[0])) else 0  # (else at k = 0 the main again)
            if k == 2:
                lm_ranking = once("head", lambda: self.lm_scores(target, t)) if prior else prefix_lm()
            n_lm = size // 4 if lm_ranking is not None else 0
            batch = top_rows(main, size - n_alt - n_lm)
            given[batch] = True
            for n, scores in ((n_alt, lambda: alt if alt is not None else free()), (n_lm, lambda: lm_ranking)):
                if n:
                    extra = top_rows(scores().masked_fill(given, -float("inf")), n)
                    given[extra] = True
                    batch = torch.cat([batch, extra])
            yield batch

    def first_scores(self, requests: list[tuple]) -> list[tuple[Tensor, Tensor]]:
        """The main and the other ranker's scores [V] (`ranking`'s first batch) of many searches at once,
        each (target, t, prior, anchors): one scores_many over all. The first batch takes a few of each,
        so they are exact for the screen_top best only, as the guesses' are (a lock-step round's 40 rows
        took 42 ms with EXACT_TOP, mostly gathering 1,024 rows of P per row). -> (main, other) per search"""
        other = [(target, t, (not prior) if self.cal.has_prior else False, None) for target, t, prior, _ in requests]
        s = self.scores_many(list(requests) + other, self.screen_top)
        return list(zip(s[:len(requests)], s[len(requests):]))

    def free_scores(self, target: Tensor, t: int) -> Tensor:
        """The linear model's scores at position t ≥ 1 without its norm term: 2g·P_v·y for the predicted
        context's residual y (no anchors, no prior; `scores` plus the g²‖P_v‖² it subtracts). [V]"""
        return self.scores(target, t, False).add_(self.cal.P_sq, alpha=self.gain ** 2)

    def lm_scores(self, target: Tensor, t: int) -> Tensor:
        """The LM's next-token logits at position t from the observed ĥ_{t−1} (its head on the normed
        state: the same order as log p_LM). [V]"""
        self._count(1)
        return self.unembed @ self.normed(target[t - 1]).float()
