"""The `learned` policy: a LinearRanker over a cached Calibration of the tap.

Guesses every position at once, so the loop speculates; position 0 also gets certified lower
bounds of every token's distance from the table (a full calibration; a fast one has no table and
no bounds). A policy only orders candidates; the loop verifies.
"""
from __future__ import annotations

import copy
import math

import torch

from ..policies import Policy
from .config import learned_config
from .fit import load_or_calibrate, observes_plain_states
from .ranker import LinearRanker

GROUP = 32  # prompts per product in begin_many (bounds the [GROUP, V] float64 temporaries)
LM_AHEAD = 32  # positions past the asked one whose LM log-probs one run of the blocks above the tap keeps


class Learned(Policy):
    name = "learned"

    def __init__(self, tap, config):
        super().__init__(tap, config)
        self.learned = learned_config(config)
        cal, self.calibration_seconds = load_or_calibrate(tap, self.learned)
        self.ranker = LinearRanker(cal, tap, self.learned.screen_top, guess_top=self.learned.guess_top)

    def begin(self, target, cost):
        self.begin_many([target], [cost], into=[self])

    def begin_many(self, targets, costs, into=None):
        """The ranker's first look at every prompt (position 0 and the guesses of every position) in
        products over GROUP prompts at a time: on a CPU a product with few rows costs about what
        reading the [V, ·] tables costs, so a lock-step batch pays it once per group, not per prompt."""
        into = into or [copy.copy(self) for _ in targets]
        for s in range(0, len(targets), GROUP):
            group = [t.float() for t in targets[s:s + GROUP]]
            g0, d0, bounds0 = self.ranker.position0(torch.stack([t[0] for t in group]), self.eps)
            for j, (rest, prior, shortlist) in enumerate(self.ranker.first_look(group)):
                p = into[s + j]
                Policy.begin(p, targets[s + j], costs[s + j])
                p.target, p.prior = group[j], prior
                p.d0, p.bounds0 = d0[j], bounds0[j] if bounds0 is not None else None
                p.guess = torch.cat([g0[j:j + 1], rest])  # [T]
                p.shortlist = shortlist  # [T - 1, m]: the candidates the guesses at 1.. were picked from (revised)
                p.anchors = {}  # t -> [(ids [n], exact states [n, d] at t on the verified prefix)]
                p.revisions = []  # not yet applied to p.guess: (t, ids [k], states [k, d])
                p.search = None  # the position whose search's first ranking is deferred (prepare)
                p.first = None  # (t, its first ranking's scores), settled
                p.lm_rows = None  # _prefix_lm's: (first row, log p of the tokens before it [first], rows [n, V])
        return into

    def guesses(self, t, ids):
        if self.revisions:
            self.settle_many([self])
        return self.guess[t:]

    @property
    def deferred(self):
        return bool(self.revisions) or self.search is not None

    def prepare(self, t):
        """The loop searches position t next: its first ranking is deferred to settle_many (in a
        lock-step batch, with the other prompts'), else done by candidates()."""
        self.search = t

    def observe(self, t, ids, states):
        seen = self.anchors.setdefault(t, [])
        if sum(len(i) for i, _ in seen) < self.learned.max_anchors:  # the fit saturates long before; bounds memory
            seen.append((ids.to(self.target.device), states.to(self.target.device, torch.float32, copy=True)))

    def revise(self, t, ids, states):
        """States of the guesses at t.. computed after a wrong guess before t: their top-1s re-ranked within the
        shortlists the first guesses came from (ranker.revised) replace the guesses there (SmolLM2, the seed-5 bench
        prompts of four sources, re-ranked over the whole vocabulary: at ℓ = 15, 7 of 14 later wrong guesses became
        right and none of 158 right ones turned wrong; at ℓ = 30, 15 of 61 and 3 of 173). Deferred to the next
        `guesses`, or to settle_many over a lock-step batch."""
        if t < len(self.guess) and len(ids):
            self.revisions.append((t, ids, states))

    @staticmethod
    def settle_many(policies):
        """Every deferred revision and first search ranking of these prompts' policies, each kind in
        one product over all (a product reads the whole [V, r] screen, whatever its few rows: SmolLM2
        layer 15, a lock-step batch of 32, ~10 ms a revision and ~4 ms a ranking each alone)."""
        ranker = policies[0].ranker
        items = [(p, t, ids, states) for p in policies for t, ids, states in p.revisions]
        if items:
            new = ranker.revised([(p.target, t, ids, states, p.prior, p.shortlist[t - 1:t - 1 + len(ids)])
                                  for p, t, ids, states in items])
            for (p, t, ids, _), guess in zip(items, new):  # in order: a later revision of a position wins
                p.guess[t:t + len(ids)] = guess
        searching = [p for p in policies if p.search is not None and p.search > 0]
        if searching:
            first = ranker.first_scores([(p.target, p.search, p.prior, p._anchors(p.search)) for p in searching])
            for p, scores in zip(searching, first):
                p.first = (p.search, scores)
        for p in policies:
            p.revisions, p.search = [], None

    def candidates(self, t, prefix):
        if t == 0:  # table distances (exact for the screened few, lower bounds for the rest) or scores
            yield from self.ranker.position0_order(self.target[0], self.d0).split(self.config.batch_size)
        else:  # (the loop skips ids already tried)
            cfg = self.config
            sizes = [min(cfg.batch_size, cfg.first_batch * 4 ** k) for k in range(8)]
            first, self.search = self.first[1] if self.first is not None and self.first[0] == t else None, None
            self.first = None
            yield from self.ranker.ranking(self.target, t, self.prior, sizes, lambda: self._anchors(t),
                                           lambda: self._prefix_lm(prefix.ids), first)

    def _prefix_lm(self, ids):
        """The LM's next-token log-probs after the verified prefix ids [t] ([V]), or None when the
        prefix does not read as text: the LM predicts its tokens no better than chance (mean
        log p ≤ −log V; random ids score far below it). With one token there is nothing to judge
        yet: used. Only at positions the ranker's first two batches missed, and for certificates' rankings
        (certify="top:K"). Where the tap observes the residual stream, the blocks above it run on the
        observed states of the prefix (the same numbers: SmolLM2 at layer 15, half a forward of the prefix),
        and of the next LM_AHEAD positions too, kept for later positions (each row reads only its own
        prefix: a 20-token prompt's certificates then run them once, not at every position); otherwise the
        prefix's ids run through the whole model."""
        t, lm = len(ids), self.tap.lm
        if not (observes_plain_states(self.tap) and not self.tap.final_norm):
            logp = lm.next_token_logprobs(ids)  # [t, V] or None
            if logp is None:
                return None
            self._count_lm(t)
            return self._if_text(logp[:-1].gather(1, ids[1:, None].to(logp.device))[:, 0], logp[-1])
        start, known, ahead = self.lm_rows or (0, None, self.target.new_zeros(0, 0))
        if not start <= t - 1 < start + len(ahead):
            logp = lm.next_token_logprobs_from(self.tap.layer, self.target[:min(len(self.target), t + LM_AHEAD)])
            if logp is None:
                return None
            self._count_lm(len(logp))
            known = logp[:t - 1].gather(1, ids[1:, None].to(logp.device))[:, 0]  # [t - 1]
            start, ahead = t - 1, logp[t - 1:].clone()  # (rows t - 1.. only: the rest freed)
            self.lm_rows = (start, known, ahead)
        seen = torch.cat([known, ahead[:t - 1 - start].gather(1, ids[start + 1:, None].to(ahead.device))[:, 0]])
        return self._if_text(seen, ahead[t - 1 - start])

    def _count_lm(self, tokens: int) -> None:
        self.cost["forward_tokens"] += tokens  # (through the blocks above the tap, or every block)
        self.cost["tap_calls"] += 1

    def _if_text(self, seen, logp):
        """logp [V] (moved to the target's device) where the prefix reads as text by seen [t − 1], the
        log-probs of its own tokens after their prefixes; else None."""
        if len(seen) and float(seen.mean()) <= -math.log(self.V):
            return None
        return logp.to(self.target.device)

    def _anchors(self, t):
        seen = self.anchors.get(t, [])
        if not seen:
            return torch.zeros(0, dtype=torch.long, device=self.target.device), self.target.new_zeros(0, self.target.shape[1])
        return torch.cat([i for i, _ in seen]), torch.cat([h for _, h in seen])

    def lower_bounds(self, t):
        return self.bounds0 if t == 0 else None
