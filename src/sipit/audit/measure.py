"""The three measurements of an audit cell (surface, layer, defence): attack, geometry, utility.

Every measurement goes through the surface (audit/surfaces.py): what leaks, the defence applied to
it, and the tap whose observation space SipIt, the margins and the collisions use.

attack     SipIt through the public API. `none`, `quant` and `project`: `invert()` on the defended
           observations through the surface's tap (project:k on states: a ProjectedTap with the
           defence's P, any vocabulary); quant: ε from the storage format's worst-case error, which
           the attacker can compute. `noise`: robust.py's nearest-candidate decoding by an attacker
           who knows σ, the noise drawn on what leaks; one pass of the candidates serves every σ of
           the layer and the certified radius.
geometry   the exact minimum pairwise distance of last-token observations of sampled prompts
           (collisions engine), and per-position margins Δ_t / ‖ĥ_t‖ with the certified noise
           radius ρ of Theorem 3.2 (robust.py), in the surface's observation space.
utility    the defence applied inside the forward pass (surface.edit: the residual stream at ℓ, or
           block ℓ's KV cache), or to the logits themselves: change of next-token cross-entropy
           (nats/token) and top-1 agreement with the undefended model on held-out text. None for a
           projection (not a forward-pass intervention).
"""
from __future__ import annotations

import time

import torch
from torch import Tensor

from ..collisions.common import analyse_layer, embedding_classes, group_ids
from ..invert import InvertConfig, invert
from ..invert.eps import tolerance_for
from ..invert.robust import RobustConfig, Robustness, RobustnessResult
from ..models import LM
from .defenses import Defense
from .surfaces import Surface

N_EXAMPLES = 3


# ---------------------------------------------------------------- attack


def attack_invert(lm: LM, surface: Surface, defense: Defense, prompts: list[list[int]], policy: str,
                  seed: int = 0, max_candidates: int | None = None) -> dict:
    """SipIt on the defended observations of `prompts` (none, quant or project), through the surface's
    tap, trying at most `max_candidates` tokens per position. -> the cell's attack dict."""
    tap = surface.tap_for(defense, seed)
    stored = [surface.defend(defense, surface.leak(ids), seed) for ids in prompts]
    observed = [surface.observe(s) for s in stored]
    quant = defense.family == "quant"  # the attacker accepts anything within the format's own error
    error = 1.01 * max(float(surface.error_bound(s, defense.param).max()) for s in stored) if quant else 0.0
    config = InvertConfig(policy=policy, observation_error=error, max_candidates=max_candidates)
    res = invert(lm, observed, tap.layer, config, progress=False, true_ids=prompts, tap=tap)
    how = f"SipIt through {tap.key}, eps = {res.eps:.3g} (measured"
    how += (f" + worst-case {defense.param} storage error +1%; greedy: a wrong token within eps ends the attempt, "
            "a joint or backtracking attacker may recover more)") if quant else ")"
    if max_candidates is not None and max_candidates < lm.vocab_size:
        how += f", at most {max_candidates} candidates per position"
    s = res.summary()
    return dict(method=how, eps=res.eps, exact_rate=s["exact_match_rate"], token_accuracy=s["token_accuracy"],
                seconds_per_prompt=s["seconds_per_prompt_mean"], candidates_per_position=s["candidates_per_position"],
                certified_share=certified_share(s), calibration_seconds=s["calibration_seconds"],
                statuses=dict(ok=s["ok"], ambiguous=s["ambiguous"], failed=s["failed"]),
                examples=[dict(original=lm.decode(p.true_ids), recovered=p.text, exact=bool(p.exact), status=p.status)
                          for p in res.prompts[:N_EXAMPLES]])


def certified_share(summary: dict) -> float | None:
    """Share of positions with a certificate, from an inversion summary (None: an engine without them)."""
    pct = summary.get("certified_positions_pct")
    return None if pct is None else pct / 100


def robustness(lm: LM, surface: Surface, prompts: list[list[int]], sigmas: list[float], config: RobustConfig,
               progress: bool = False) -> tuple[RobustnessResult, float]:
    """robust.py on `prompts` with σ = 0 and `sigmas` (one candidate pass per prompt serves all), in the
    surface's observation space with its noise. Also returns the seconds its policy spent calibrating
    (0 when cached): the audit's one-time cost."""
    from tqdm.auto import tqdm

    config = RobustConfig(**{**config.__dict__, "sigmas": tuple(sorted({0.0, *sigmas}))})
    tap = surface.tap
    engine = Robustness(lm, tap.layer, config, tap=tap, noise=surface.noise)
    res = RobustnessResult(model=lm.name, layer=tap.layer, final_norm=tap.final_norm, config=config,
                           exhaustive=config.candidates is None)
    t0 = time.perf_counter()
    for ids in tqdm(prompts, desc=f"noise {tap.key}", unit="prompt", disable=not progress, leave=False):
        res.prompts.append(engine.prompt(ids))
    res.seconds = time.perf_counter() - t0
    return res, getattr(engine.policy, "calibration_seconds", 0.0)


def attack_noise(lm: LM, res: RobustnessResult, sigma: float) -> dict:
    """The attack dict of the noise:σ cell, read from a robustness run that included σ."""
    i = list(res.config.sigmas).index(sigma)
    P = res.prompts
    firsts = [[len(p.ids) if e is None else e for e in p.first_error[i]] for p in P]  # correct prefix lengths
    bound = "certified" if res.exhaustive else "upper bound: candidate subset"
    return dict(method=f"nearest-candidate decoding, sigma known ({len(P[0].first_error[i])} noisy copies per "
                       f"prompt; {'every token' if res.exhaustive else 'policy top-k + random k'} per position)",
                exact_rate=sum(p.exact[i] for p in P) / len(P),
                token_accuracy=sum(sum(f) / len(p.ids) / len(f) for f, p in zip(firsts, P)) / len(P),
                token_accuracy_note="correct prefix before the first wrong position",
                seconds_per_prompt=round(sum(p.seconds for p in P) / len(P), 4),
                seconds_note="one candidate pass per prompt serves every sigma of the layer",
                candidates_per_position=sum(p.candidates_per_position for p in P) / len(P),
                certified_share=sum(sigma < p.radius_rel for p in P) / len(P) if res.exhaustive else None,
                certified_note=f"prompts with sigma below their radius ({bound})",
                examples=[_prefix_example(lm, p.ids, f[0]) for p, f in list(zip(P, firsts))[:N_EXAMPLES]])


def _prefix_example(lm: LM, ids: list[int], correct: int) -> dict:
    """An example of decoding that follows a prompt until its first wrong position."""
    return dict(original=lm.decode(ids), recovered=lm.decode(ids[:correct]) + ("" if correct == len(ids) else " [...]"),
                exact=correct == len(ids), status=f"exact through position {correct} of {len(ids)}")


# ---------------------------------------------------------------- geometry


@torch.no_grad()
def last_token_observations(tap, prompts: list[list[int]], batch: int = 64) -> Tensor:
    """What `tap` observes at the last position of equal-length prompts. -> [N, tap.dim] (CPU)"""
    return torch.cat([tap.states(torch.tensor(prompts[i:i + batch], device=tap.lm.device))[:, -1].cpu()
                      for i in range(0, len(prompts), batch)])


def collisions(lm: LM, prompts: list[list[int]], layer: int, states: Tensor) -> dict:
    """Exact minimum distance among the last-token observations [N, dim] of `prompts`, a function of the
    states at `layer`, with structural classes set apart (duplicate embedding rows; at layer 0 the last
    token alone)."""
    canon = embedding_classes(lm).tolist()
    keys = [canon[p[-1]] if layer == 0 else tuple(canon[v] for v in p) for p in prompts]
    a = analyse_layer(states, group_ids(keys), layer=layer, threshold=1e-6, keep=5)
    return dict(prompts=a["n"], pairs=a["n_pairs"], min_distance=a["min_distance"], min_relative=a["min_relative"],
                median_norm=a["median_norm"], structural_pairs=a["structural"]["pairs"],
                distance_quantiles=a["distribution"]["relative_quantiles"] if a["distribution"] else None,
                quantiles=a["distribution"]["quantiles"] if a["distribution"] else None)


def margins(res: RobustnessResult, calibration_seconds: float = 0.0) -> dict:
    """Per-position relative margins Δ_t/‖ĥ_t‖ and the certified noise radius of a robustness run."""
    rel = sorted(D / n for p in res.prompts for D, n in zip(p.delta, p.norm))
    s = res.summary()
    q = lambda f: rel[min(int(f * len(rel)), len(rel) - 1)]  # noqa: E731
    return dict(relative_margins=rel, margin_quantiles={str(f): q(f) for f in (0.0, 0.01, 0.1, 0.5, 0.9, 1.0)},
                radius_rel_min=s["radius_rel_min"], radius_rel_median=s["radius_rel_median"],
                radius_abs_min=s["radius_abs_min"], exhaustive=res.exhaustive, bound=s["bound"],
                seconds=s["seconds"], calibration_seconds=round(calibration_seconds, 2))


# ---------------------------------------------------------------- utility


@torch.no_grad()
def next_token(lm: LM, ids: Tensor, logits: Tensor | None = None) -> tuple[float, Tensor]:
    """ids [B, T] (and their logits [B, T, V]; default lm.logits) -> (mean next-token cross-entropy in
    nats, predicted ids [B, T-1])."""
    logits = (lm.logits(ids) if logits is None else logits)[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return float(ce), logits.argmax(-1)


@torch.no_grad()
def utility(lm: LM, surface: Surface, defense: Defense, ids: Tensor, clean: tuple[float, Tensor],
            seed: int = 0) -> dict | None:
    """The defence applied where the model reads the surface (surface.edit; logits: the logits of
    held-out ids [B, T] themselves). None for a projection or an SAE's latents: the model never reads them."""
    if surface.kind in ("projection", "sae"):
        return None
    ce0, top0 = clean
    if surface.kind == "logits":
        ce, top = next_token(lm, ids, surface.defend(defense, lm.logits(ids), seed))
    else:
        with surface.edit(defense, seed):
            ce, top = next_token(lm, ids)
    return dict(ce_clean=ce0, ce_defended=ce, delta_ce=ce - ce0, top1_agreement=float((top == top0).double().mean()),
                tokens=int(top.numel()))
