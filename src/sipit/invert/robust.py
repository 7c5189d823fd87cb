"""Inversion under perturbation (Theorem 3.2): per-position margins, a certified noise radius, and
exact recovery of noisy states by nearest-candidate decoding.

For a prompt with observed states ĥ_t, and h_t(v) the state of token v on the true prefix:

    Δ_t = min over v outside the true token's duplicate class of ‖h_t(v) − ĥ_t‖   (absolute L2)
    δ_t = ‖h_t(true) − ĥ_t‖                                    (recomputation error, ~1e-5)
    r_t = (Δ_t − δ_t) / 2,   r = min_t r_t,   ρ = min_t r_t / ‖ĥ_t‖   (certified radii)

Nearest-candidate decoding picks, at each position, the candidate whose state on the recovered
prefix is closest to the noisy state ĥ_t + e_t. If ‖e_t‖ < r_t at every position, then by induction
on t (the prefix is correct) the true token is at distance ≤ δ_t + ‖e_t‖ and any other at ≥
Δ_t − ‖e_t‖ > δ_t + ‖e_t‖: the whole prompt is recovered exactly. So ρ is the *relative* noise a
prompt provably survives.

Noise model: at each position an isotropic Gaussian direction scaled to norm exactly σ‖ĥ_t‖
(σ relative, like the engine's ε). The prompt is certified at σ iff σ < ρ.

Candidates: `candidates=None` evaluates every vocabulary token at every position (exact Δ_t: cheap
on tiny models, ~V/600 s per position on SmolLM2 CPU). `candidates=k` evaluates only the policy's
top k on the clean state plus k random tokens plus the true token: Δ_t is then an **upper bound**
(a token never evaluated might be closer), the radius is not a certificate, and decoding is
restricted to a set that contains the true token (an optimistic recovery rate).

One pass of the candidates per position serves the margins and all noisy copies at once; a noisy
copy stops being followed at its first wrong position (exact recovery is then already lost).

    res = run(lm, ids_list, layer=2, config=RobustConfig(sigmas=(0.01, 0.1, 1.0)))
    res.curve()        # [{sigma, exact_rate, certified_rate}, ...]
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from ..models import LM, LayerTap
from .config import InvertConfig
from .verify import duplicate_classes


@dataclass
class RobustConfig:
    sigmas: tuple[float, ...] = (0.0, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)  # relative noise norms
    trials: int = 4  # noisy copies per prompt and σ
    candidates: int | None = None  # None: every token (exact Δ_t); k: policy top-k + k random (upper bound)
    policy: str = "learned"  # ranks the top-k when candidates is set
    batch_size: int = 512  # candidates per forward pass
    seed: int = 0  # noise directions and random candidates


@dataclass
class PromptRobustness:
    ids: list[int]
    delta: list[float]  # Δ_t, absolute
    recompute: list[float]  # δ_t, absolute
    norm: list[float]  # ‖ĥ_t‖
    radius: float  # r = min_t (Δ_t − δ_t)/2, absolute L2
    radius_rel: float  # ρ = min_t (Δ_t − δ_t)/(2‖ĥ_t‖)
    exact: list[float]  # per σ: fraction of trials recovered exactly
    first_error: list[list[int | None]]  # per σ and trial: first wrong position (None: exact)
    candidates_per_position: int
    seconds: float


@dataclass
class RobustnessResult:
    model: str
    layer: int
    final_norm: bool
    config: RobustConfig
    exhaustive: bool  # True: Δ_t exact over the whole vocabulary; False: upper bounds
    prompts: list[PromptRobustness] = field(default_factory=list)
    seconds: float = 0.0

    def curve(self) -> list[dict]:
        """Per σ: mean exact-recovery rate over prompts × trials, and fraction of prompts certified (σ < ρ)."""
        P = self.prompts
        return [dict(sigma=s,
                     exact_rate=sum(p.exact[i] for p in P) / len(P),
                     certified_rate=sum(s < p.radius_rel for p in P) / len(P))
                for i, s in enumerate(self.config.sigmas)]

    def summary(self) -> dict:
        rel = sorted(p.radius_rel for p in self.prompts)
        ab = sorted(p.radius for p in self.prompts)
        return dict(model=self.model, layer=self.layer, final_norm=self.final_norm, prompts=len(self.prompts),
                    exhaustive=self.exhaustive, bound="exact" if self.exhaustive else "upper bound (candidate subset)",
                    noise="per position: Gaussian direction, norm sigma*||h_t||",
                    radius_rel_min=rel[0], radius_rel_median=rel[len(rel) // 2],
                    radius_abs_min=ab[0], radius_abs_median=ab[len(ab) // 2],
                    curve=self.curve(), seconds=round(self.seconds, 2))

    def to_dict(self) -> dict:
        return dict(summary=self.summary(), config=asdict(self.config),
                    prompts=[asdict(p) for p in self.prompts])


def add_noise(states: Tensor, sigma: float, generator: torch.Generator | None = None) -> Tensor:
    """states [..., T, d] -> states + e with ‖e_t‖ = σ‖ĥ_t‖ per position, random direction."""
    h = states.double()
    u = torch.randn(h.shape, generator=generator, dtype=torch.float64).to(h.device)  # drawn on the CPU: reproducible
    u = u / u.norm(dim=-1, keepdim=True)
    return (h + sigma * h.norm(dim=-1, keepdim=True) * u).to(states.dtype)


class Robustness:
    """Margins and noisy decoding for one (model, layer, norm); reusable across prompts."""

    def __init__(self, lm: LM, layer: int, config: RobustConfig | None = None, final_norm: bool = False,
                 tap=None, noise=add_noise):
        """tap: what is observed (default LayerTap(lm, layer, final_norm); a surface's tap puts margins,
        radii and decoding in its observation space). noise(clean [R, T, dim], σ, generator) -> the noisy
        observations: how a defence of level σ perturbs them (default add_noise)."""
        self.lm, self.config, self.noise = lm, config or RobustConfig(), noise
        self.tap = tap if tap is not None else LayerTap(lm, layer, final_norm=final_norm)
        self.dups = duplicate_classes(lm)
        self.policy = None
        if self.config.candidates is not None:
            from .policies import make_policy

            self.policy = make_policy(self.config.policy, self.tap, InvertConfig(batch_size=self.config.candidates))

    def _candidate_ids(self, t: int, prefix, true: int, gen: torch.Generator) -> Tensor:
        """Ids evaluated at position t: [V] (every token) or [≤ 2k+1] (top-k ∪ random-k ∪ true)."""
        V, k = self.lm.vocab_size, self.config.candidates
        if k is None:
            return torch.arange(V)
        top = next(iter(self.policy.candidates(t, prefix)), torch.zeros(0, dtype=torch.long))
        top = torch.as_tensor(top, dtype=torch.long).flatten()[:k]
        rand = torch.randperm(V, generator=gen)[:k]
        return torch.unique(torch.cat([top, rand, torch.tensor([true])]))

    @torch.no_grad()
    def prompt(self, ids: list[int], states: Tensor | None = None) -> PromptRobustness:
        """ids [T] (and observed states [T, d]; default one full forward) -> PromptRobustness."""
        t0 = time.perf_counter()
        cfg = self.config
        ids_t = torch.as_tensor(ids, dtype=torch.long)
        T = len(ids_t)
        clean = (self.tap.states(ids_t) if states is None else states).double()  # [T, d]
        gen = torch.Generator().manual_seed(cfg.seed + sum(ids) % 100_003)
        S, R = len(cfg.sigmas), cfg.trials
        noisy = torch.stack([self.noise(clean[None].expand(R, T, -1), s, gen) for s in cfg.sigmas])  # [S, R, T, d]
        noisy = noisy.reshape(S * R, T, -1)
        alive = torch.ones(S * R, dtype=torch.bool)  # correct so far
        first_error: list[int | None] = [None] * (S * R)
        if self.policy is not None:
            self.policy.begin(clean.to(self.lm.dtype), {"forward_tokens": 0, "backward_tokens": 0, "tap_calls": 0})
        delta, recompute, n_cand = [], [], 0
        for t in range(T):
            prefix = self.tap.prefill(ids_t[:t])
            true = int(ids_t[t])
            cls = torch.tensor(self.dups.members(true))
            cand = self._candidate_ids(t, prefix, true, gen)
            n_cand += len(cand)
            best_other, d_true = float("inf"), float("nan")
            best_noisy = torch.full((S * R,), float("inf"), dtype=torch.float64)
            best_id = torch.full((S * R,), -1, dtype=torch.long)
            for batch in cand.split(self.tap.rows_that_fit(t + 1, cfg.batch_size)):  # (fewer on a full GPU)
                h = self.tap.extend(prefix, batch).double()  # [B, d]
                d = (h - clean[t]).norm(dim=-1)  # [B]
                same = torch.isin(batch, cls)
                if (~same).any():
                    best_other = min(best_other, float(d[~same].min()))
                if (batch == true).any():
                    d_true = float(d[batch == true][0])
                dn = torch.cdist(noisy[:, t], h)  # [S*R, B]
                m, j = dn.min(dim=1)
                better = m < best_noisy
                best_noisy[better], best_id[better] = m[better], batch[j[better]]
            delta.append(best_other)
            recompute.append(d_true)
            wrong = alive & ~torch.isin(best_id, cls)
            for i in wrong.nonzero().flatten().tolist():
                first_error[i] = t
            alive &= ~wrong
        norm = clean.norm(dim=-1).tolist()
        r_t = [(D - e) / 2 for D, e in zip(delta, recompute)]
        exact = alive.reshape(S, R).double().mean(1).tolist()
        return PromptRobustness(
            ids=list(map(int, ids)), delta=delta, recompute=recompute, norm=norm, radius=min(r_t),
            radius_rel=min(r / n for r, n in zip(r_t, norm)), exact=exact,
            first_error=[first_error[i * R:(i + 1) * R] for i in range(S)],
            candidates_per_position=round(n_cand / T), seconds=round(time.perf_counter() - t0, 3))


def run(lm: LM, prompts: list[list[int]], layer: int, config: RobustConfig | None = None, final_norm: bool = False,
        progress: bool = False) -> RobustnessResult:
    """Certified radii and exact-recovery rate vs σ for token-id prompts (states from one full forward)."""
    from tqdm.auto import tqdm

    config = config or RobustConfig()
    layer = lm.layer_index(layer)
    engine = Robustness(lm, layer, config, final_norm)
    res = RobustnessResult(model=lm.name, layer=layer, final_norm=final_norm, config=config,
                           exhaustive=config.candidates is None)
    t0 = time.perf_counter()
    for ids in tqdm(prompts, desc=f"robustness L{layer}", unit="prompt", disable=not progress):
        res.prompts.append(engine.prompt(ids))
    res.seconds = time.perf_counter() - t0
    return res


def plot(res: RobustnessResult, path) -> None:
    """Exact-recovery rate and certified fraction vs σ (log x), certified radii marked. -> PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = res.curve()
    xs = [r["sigma"] for r in c]
    pos = [x if x > 0 else min([s for s in xs if s > 0] or [1e-6]) / 10 for x in xs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(pos, [r["exact_rate"] for r in c], "o-", label="exact recovery (nearest candidate)")
    ax.plot(pos, [r["certified_rate"] for r in c], "s--", label="certified (σ < ρ of the prompt)")
    s = res.summary()
    kind = "certified" if res.exhaustive else "upper-bound"
    ax.axvline(s["radius_rel_min"], color="r", ls=":", label=f"min {kind} radius ρ = {s['radius_rel_min']:.3g}")
    ax.axvline(s["radius_rel_median"], color="g", ls=":", label=f"median ρ = {s['radius_rel_median']:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("relative noise σ = ‖e_t‖ / ‖ĥ_t‖")
    ax.set_ylabel("fraction of prompts")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"{res.model} layer {res.layer}: {len(res.prompts)} prompts × {res.config.trials} trials")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
