"""Candidate orderings for SipIt. A policy only decides what to try first; the loop verifies.

Interface (all methods cheap unless noted):
    begin(target [T, d], cost)    a new prompt; cost: the loop's counter (policies add backward_tokens)
    begin_many(targets, costs) -> one begun copy per prompt (lock-step; may share work across prompts)
    guesses(t, ids) -> [T-t] | None   top-1 guesses for positions t.. (speculation), or None
    candidates(t, prefix) -> iterator of id batches [B], best first (may be lazy and expensive)
    observe(t, ids [B], states [B, d])  wrong candidates' exact states at t on the verified prefix
    revise(t, ids [k], states [k, d])   states of guesses at t.. after a wrong guess before t (not exact)
    prepare(t)                        the loop searches position t next
    deferred -> truthy when revise or prepare left work; settle_many(policies) does it for many
                                      prompts at once (lock-step), else guesses/candidates do
    lower_bounds(t) -> [V] | None     certified lower bounds of every token's relative distance

Policies:
- exhaustive: the whole vocabulary in id order (the paper's BruteForce, batched).
- random:     the whole vocabulary in a seeded random order.
- gradient:   the paper's policy: a continuous proxy embedding e descends ½‖h_t(π ⊕ e) − ĥ_t‖²
              (normalised by ‖ĥ_t‖²); every K steps the nearest not-yet-proposed rows are proposed.
- learned:    calibrated per (model, layer, norm) on the model's own states (learned/): position
              0 by an exact table of every token's state at position 0 (also a certified bound for
              every token; `--calibration fast`: a linear model instead, no bounds), positions ≥ 1 by a forward linear model h_t ≈ A e_v + B ĥ_{t−1} + c,
              each token scored by the Gaussian log-likelihood of the observed ĥ_t. Guesses every
              position, so the loop speculates.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from ..models import LayerTap


class Policy:
    name = "base"
    eps: float | None = None  # the loop's acceptance threshold (relative distance), set by the engine that runs it

    def __init__(self, tap: LayerTap, config):
        self.tap, self.config = tap, config
        self.V = tap.lm.vocab_size

    def begin(self, target: Tensor, cost: dict) -> None:
        self.target, self.cost = target, cost

    def begin_many(self, targets: list[Tensor], costs: list[dict]) -> list["Policy"]:
        """A begun copy of this policy per prompt (lock-step inversion; shallow copies share what
        the policy loaded once, e.g. a calibration). Override to share work across the prompts."""
        copies = [copy.copy(self) for _ in targets]
        for p, target, cost in zip(copies, targets, costs):
            p.begin(target, cost)
        return copies

    def guesses(self, t: int, ids: Tensor) -> Tensor | None:
        return None

    def candidates(self, t: int, prefix):
        raise NotImplementedError

    def lower_bounds(self, t: int) -> Tensor | None:
        return None

    def observe(self, t: int, ids: Tensor, states: Tensor) -> None:
        pass

    def revise(self, t: int, ids: Tensor, states: Tensor) -> None:
        pass

    def prepare(self, t: int) -> None:
        pass

    deferred = False

    @staticmethod
    def settle_many(policies: list["Policy"]) -> None:
        pass


class Exhaustive(Policy):
    name = "exhaustive"

    def candidates(self, t, prefix):
        yield from torch.arange(self.V).split(self.config.batch_size)


class Random(Policy):
    name = "random"

    def candidates(self, t, prefix):
        g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + t)
        yield from torch.randperm(self.V, generator=g).split(self.config.batch_size)


class Gradient(Policy):
    """The paper's gradient-guided policy, proposing a few nearest unvisited rows per snap."""

    name = "gradient"

    def __init__(self, tap, config):
        super().__init__(tap, config)
        self.E = tap.lm.embedding_rows()  # [V, d]
        self.E_sq = (self.E.double() ** 2).sum(1)  # [V]
        self.scale = float(self.E.norm(dim=1).mean())

    def candidates(self, t, prefix):
        cfg = self.config.gradient
        target = self.target[t]
        proposed = torch.zeros(self.V, dtype=torch.bool)
        e = self.E.mean(0).clone().requires_grad_(True)
        opt = torch.optim.Adam([e], lr=cfg.lr * self.scale)
        for step in range(cfg.steps):
            opt.zero_grad()
            h = self.tap.extend_embeds(prefix, e[None])[0]  # [d]
            loss = 0.5 * ((h - target) ** 2).sum() / (target ** 2).sum()
            loss.backward()
            self.cost["backward_tokens"] += 1
            self.cost["forward_tokens"] += 1
            self.cost["tap_calls"] += 1
            opt.step()
            if (step + 1) % cfg.snap_every == 0:
                with torch.no_grad():  # nearest rows to e by Euclidean distance, unvisited only
                    d = self.E_sq - 2 * (self.E.double() @ e.detach().double())
                    d[proposed] = float("inf")
                    batch = d.topk(min(cfg.snap_k, int((~proposed).sum())), largest=False).indices
                    batch = batch[d[batch] < float("inf")]
                proposed[batch] = True
                if len(batch):
                    yield batch
        # then the loop falls back to the rest of the vocabulary


from .learned.policy import Learned  # noqa: E402  (it subclasses Policy, defined above)

POLICIES = {"exhaustive": Exhaustive, "random": Random, "gradient": Gradient, "learned": Learned}


def make_policy(name, tap: LayerTap, config) -> Policy:
    """A policy by name, or by class (any Policy subclass)."""
    if isinstance(name, type) and issubclass(name, Policy):
        return name(tap, config)
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: choose from {', '.join(POLICIES)}")
    return POLICIES[name](tap, config)
