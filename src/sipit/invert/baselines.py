"""The paper's two baselines (Table 2), through the same layer tap and result format as SipIt.

- **bruteforce**: every candidate in a random order over the whole vocabulary, verified one at a
  time (batch size 1, no speculation, no lookahead). Not new loop code: it is the SipIt engine
  configured with the `random` policy, so its verification and accounting are SipIt's.
- **hardprompts**: PEZ (Wen et al. 2023) as the paper adapted it. All T input embeddings are
  optimised jointly (AdamW) against the distance to the observed states; at every step the
  continuous embeddings are projected to their nearest vocabulary rows, the loss and its gradient
  are taken at the projected point, and that gradient is applied to the continuous embeddings.
  The answer is the projected sequence with the lowest loss; its positions are then checked with
  the same ε as SipIt (so `status` is "ok" only if every position verifies).

    r = bruteforce(lm, states, layer=15, max_seconds=60)          # InversionResult, policy "bruteforce"
    r = hardprompts(lm, states, layer=15, config=HardPromptsConfig(steps=500))
    r.prompts[0].loss_curve                                       # hardprompts: loss per step
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ..models import LM, LayerTap
from .certify import Certifier
from .driver import bruteforce_config, run
from .result import HardPromptsResult, Position, judge
from .verify import rel_distance

log = logging.getLogger("sipit.hardprompts")


def bruteforce(lm: LM | str, states, layer: int, final_norm: bool = False, seed: int = 0,
               max_seconds: float | None = None, eps: float | None = None, progress: bool = True,
               true_ids=None):
    """states [T, d] / [B, T, d] / list of [T_i, d] -> InversionResult (policy "bruteforce").

    max_seconds caps each prompt; a capped prompt is "failed" with the positions it finished.
    """
    return run("bruteforce", lm, states, layer, bruteforce_config(seed, max_seconds, eps), final_norm=final_norm,
               progress=progress, true_ids=true_ids)


# -- HardPrompts (PEZ) -------------------------------------------------------------------------


@dataclass
class HardPromptsConfig:
    steps: int | None = None  # optimisation steps per prompt; None: the paper's budget ¼·T·|V|
    max_seconds: float | None = 60.0  # per prompt wall-clock cap (None: only `steps`)
    lr: float = 0.01  # AdamW step, relative to the mean embedding-row norm (SmolLM2 L15, 150 steps:
    #                   0.1 wanders, median loss 0.72 -> 0.72; 0.01: 0.76 -> 0.55; 0.002: 0.76 -> 0.53 but
    #                   too slow to leave its start on the tiny test models)
    weight_decay: float = 0.1  # PEZ's default
    seed: int = 0  # random initial tokens
    log_every: int = 50  # log the loss every K steps (logger "sipit.hardprompts", INFO)
    eps: float | None = None  # verification threshold of the answer; None: measured (eps.py) + observation_error
    observation_error: float = 0.0  # as InvertConfig's: storage rounding or added noise of the observations
    certify: str = "none"  # certificates of a verified answer: "none" | "top:K" | "full" (certify.py)


class HardPrompts:
    """PEZ inversion for one tap; reusable across prompts."""

    name = "hardprompts"
    calibration_seconds = 0.0

    def __init__(self, lm: LM | None = None, layer: int | None = None, config: HardPromptsConfig | None = None,
                 final_norm: bool = False, eps: float = 1e-4, tap=None):
        self.tap = tap if tap is not None else LayerTap(lm, layer, final_norm=final_norm)
        self.lm, self.config, self.eps = self.tap.lm, config or HardPromptsConfig(), eps
        self.E = self.lm.embedding_rows().to(self.lm.dtype)  # [V, d]
        self.E_sq = (self.E.float() ** 2).sum(1)  # [V]
        self.scale = float(self.E.float().norm(dim=1).mean())

    def project(self, e: Tensor) -> Tensor:
        """e [T, d] -> ids [T] of the nearest embedding rows (Euclidean)."""
        return (self.E_sq[None] - 2 * e.float() @ self.E.float().T).argmin(1)

    def loss(self, h: Tensor, target: Tensor) -> Tensor:
        """h, target [T, d] -> mean over positions of ‖h_t − ĥ_t‖² / ‖ĥ_t‖² (scalar).

        Squared ℓ2 per position, normalised so that position 0's massive activations don't dominate.
        """
        return (((h.float() - target.float()) ** 2).sum(-1) / (target.float() ** 2).sum(-1).clamp_min(1e-30)).mean()

    def invert_prompt(self, target: Tensor, true_ids: list[int] | None = None) -> HardPromptsResult:
        """target [T, d] (observed states) -> PromptResult with the best projected sequence."""
        cfg, t0 = self.config, time.perf_counter()
        T, V = target.shape[0], self.lm.vocab_size
        target = target.to(self.lm.dtype)
        steps = cfg.steps if cfg.steps is not None else max(1, T * V // 4)
        g = torch.Generator().manual_seed(cfg.seed)
        e = self.E[torch.randint(V, (T,), generator=g)].clone().requires_grad_(True)  # [T, d] continuous
        opt = torch.optim.AdamW([e], lr=cfg.lr * self.scale, weight_decay=cfg.weight_decay)
        visited = torch.zeros(T, V, dtype=torch.bool)
        curve: list[float] = []
        best_loss, best_ids = float("inf"), None
        for step in range(steps):
            if cfg.max_seconds is not None and time.perf_counter() - t0 > cfg.max_seconds:
                log.info("hardprompts: time cap %.0fs reached after %d steps", cfg.max_seconds, step)
                break
            with torch.no_grad():
                ids = self.project(e)  # [T]
            visited[torch.arange(T), ids] = True
            p = self.E[ids].clone().requires_grad_(True)  # [T, d] projected point
            loss = self.loss(self.tap.states_from_embeds(p[None])[0], target)
            (grad,) = torch.autograd.grad(loss, p)
            opt.zero_grad()
            e.grad = grad.to(e.dtype)  # the gradient at the projected point moves the continuous one
            opt.step()
            curve.append(float(loss.detach()))
            if curve[-1] < best_loss:
                best_loss, best_ids = curve[-1], ids.clone()
            if cfg.log_every and step % cfg.log_every == 0:
                log.info("hardprompts step %d: loss %.5g (best %.5g)", step, curve[-1], best_loss)
            if best_loss == 0.0:
                break
        n = len(curve)
        if best_ids is None:  # no step fitted in the cap: the projection of the initial point
            best_ids = self.project(e.detach())
        with torch.no_grad():
            d = rel_distance(self.tap.states(best_ids), target)  # [T]
        tried = visited.sum(1).clamp_min(1).tolist()
        positions = [Position(token=int(v), distance=float(dv), margin=None, margin_over=0, tried=int(k),
                              via="hardprompts") for v, dv, k in zip(best_ids.tolist(), d.tolist(), tried)]
        bad = int((d > self.eps).sum())
        cost = dict(forward_tokens=T * (n + 1), backward_tokens=T * n, tap_calls=n + 1)
        if bad == 0:  # a verified sequence: its positions get the same certificates as SipIt's
            Certifier(self.tap, self.eps, self.config.certify).certify(target, best_ids, positions, {}, cost)
        capped = n < steps and best_loss > 0.0
        status, message = judge(positions, self.eps, "" if bad == 0 else (
            ("time cap reached; " if capped else "") + f"{bad}/{T} positions of the best projected sequence are "
            f"not within eps={self.eps:g} after {n} steps (best loss {best_loss:.4g})"))
        ids = best_ids.tolist()
        return HardPromptsResult(ids=ids, text=self.lm.decode(ids), status=status, positions=positions,
                                 seconds=time.perf_counter() - t0, length=T, message=message,
                                 true_ids=list(true_ids) if true_ids is not None else None, loss_curve=curve,
                                 **cost).check()


def hardprompts(lm: LM | str, states, layer: int, config: HardPromptsConfig | None = None, final_norm: bool = False,
                progress: bool = True, true_ids=None):
    """states [T, d] / [B, T, d] / list of [T_i, d] -> InversionResult (policy "hardprompts")."""
    return run("hardprompts", lm, states, layer, config or HardPromptsConfig(), final_norm=final_norm,
               progress=progress, true_ids=true_ids)


__all__ = ["HardPrompts", "HardPromptsConfig", "bruteforce", "hardprompts"]
