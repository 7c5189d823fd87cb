"""Certificates of recovered positions: which other tokens were shown to be farther than ε.

After a prompt is recovered, every accepted position t evaluates, on its verified prefix, the
alternatives a certificate needs:
- always: the token's near-duplicate embedding rows (verify.near_duplicates: the likeliest
  collisions) and the tokens a policy's lower bounds cannot exclude (closest BOUND_CHECK_MAX);
- `certify="top:K"`: the policy's K best-ranked others; `certify="full"`: the whole vocabulary.
Then margin = min over the other tokens covered (evaluated distance, or lower bound), and the
position is *certified* when that covers every token outside the duplicate class and margin > ε.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..models.tap import Prefix
from .config import certify_top
from .result import Position
from .verify import duplicate_classes, near_duplicates, rel_distance

BOUND_CHECK_MAX = 4096  # tokens a lower bound cannot exclude, evaluated per position (closest first)
NO_CLASSES = (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64))  # (read only)


class Certifier:
    def __init__(self, tap, eps: float, certify: str = "none", batch_size: int = 256):
        self.tap, self.lm, self.eps, self.batch_size = tap, tap.lm, eps, batch_size
        self.top = certify_top(certify, self.lm.vocab_size)
        self.dups, self.near = duplicate_classes(self.lm), near_duplicates(self.lm)

    def certify(self, target: Tensor, ids: Tensor, positions: list[Position], evaluated: dict, cost: dict,
                policy=None) -> None:
        """Fill the certificate of every accepted position, evaluating what it needs here (passes of up to
        batch_size candidates, any positions each; SipIt's loop asks its driver instead). target [T, dim];
        ids [T] recovered; evaluated: t -> {id: distance} already known (updated); cost: forward_tokens /
        tap_calls (updated)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.lm.device)
        prefix = Prefix(ids, make=lambda: self.tap.prefill(ids).cache,  # (run only if something is evaluated)
                        regrow=self.tap.regrow)
        rows = self.tap.rows_that_fit(len(ids) + 1, self.batch_size)
        for part in chunks(self.wanted(prefix, positions, evaluated, policy), rows):
            answers = self.tap.extend_many(self.requests(prefix, part), rows)
            self.record(target, part, [h[:, 0] for h, _ in answers], positions, evaluated)
            cost["forward_tokens"] += sum(len(c) for _, c in part)
            cost["tap_calls"] += 1
        self.fill(positions, evaluated, policy)

    def wanted(self, prefix, positions: list[Position], evaluated: dict, policy=None) -> list[tuple[int, Tensor]]:
        """What the certificates still need evaluated: (t, candidate ids [n]) for each accepted position with
        any: the token's near-duplicates, the tokens the policy's lower bounds cannot exclude, and with
        certify="top:K" the policy's K best (less what was evaluated already). prefix: the recovered prefix
        (Prefix; the policy ranks position t on prefix.crop(t))."""
        V, out = self.lm.vocab_size, []
        for t, q in enumerate(positions):
            if q.token is None:
                continue
            known = evaluated.setdefault(t, {})
            bounds = policy.lower_bounds(t) if policy is not None else None
            if bounds is None and not self.top and q.token not in self.near:  # nothing more to evaluate
                continue
            skip = torch.zeros(V, dtype=torch.bool)
            skip[self.dups.members(q.token) + list(known)] = True
            if bounds is not None:
                bounds = bounds.cpu()
                skip |= bounds > self.eps  # soundly excluded already
            extra = [torch.tensor(self.near.get(q.token, []), dtype=torch.long)]
            if bounds is not None:
                open_ = (~skip).nonzero().flatten()
                extra.append(open_[bounds[open_].argsort()[:BOUND_CHECK_MAX]])
            if self.top:
                ranked = policy.candidates(t, prefix.crop(t)) if policy is not None else iter(())
                queue = Queue(ranked, skip.clone())
                extra += list(iter(lambda: queue.take(self.top - queue.taken), None))
            cand = torch.cat(extra)
            cand = cand[~skip[cand]].unique()
            if len(cand):
                out.append((t, cand))
        return out

    def requests(self, prefix, part: list[tuple[int, Tensor]]) -> list[tuple]:
        """A part of `wanted` (chunks) as tap.extend_many requests: each position's candidates as one-token rows on
        its crop of the recovered prefix (its cache: no pass of the prefix)."""
        return [(prefix.crop(t), cand[:, None].to(self.lm.device)) for t, cand in part]

    @staticmethod
    def record(target: Tensor, wanted: list[tuple[int, Tensor]], states: list[Tensor], positions: list[Position],
               evaluated: dict) -> None:
        """The distances of `wanted`'s candidates from their states [n, dim] each (same order) into evaluated."""
        for (t, cand), h in zip(wanted, states):
            evaluated[t].update(zip(cand.tolist(), rel_distance(h, target[t]).cpu().tolist()))
            positions[t].tried += len(cand)

    def fill(self, positions: list[Position], evaluated: dict, policy=None) -> None:
        """The certificate of every accepted position from the distances evaluated there and the policy's
        lower bounds."""
        for t, q in enumerate(positions):
            if q.token is not None:
                bounds = policy.lower_bounds(t) if policy is not None else None
                self.certificate(q, evaluated.setdefault(t, {}), bounds.cpu() if bounds is not None else None)

    def certificate(self, q: Position, evaluated: dict[int, float], bounds: Tensor | None) -> None:
        """margin, margin_over, certified(_by), duplicates, also_within_eps of an accepted position from
        the distances evaluated there and lower bounds [V] for the rest."""
        cls, rep = self.dups.members(q.token), self.dups.rep  # rep [V]: each token's class (its smallest id)
        q.duplicates = cls if len(cls) > 1 else None
        others = {u: du for u, du in evaluated.items() if u not in cls}
        # nothing known of another token (most positions of a speculated prompt): no certificate, at once (the
        # tensor work below took ~20 µs a position, 0.4 ms of a prompt whose layer-1 forward takes 2 ms)
        if not others and bounds is None:
            q.margin, q.margin_over, q.certified, q.certified_by, q.also_within_eps = None, 0, False, None, None
            return
        classes, closest = self._by_class(others)
        n_others = int(self.dups.size[classes].sum()) if len(classes) else 0
        margin = float(closest.min()) if len(classes) else None
        by_bound = 0
        if bounds is not None:  # tokens never evaluated but certified to be at least this far: all but the
            #                     members of q's class and of every evaluated one (shut)
            shut = [u for c in classes.tolist() + [int(rep[q.token])] for u in self.dups.members(c) if u < len(bounds)]
            by_bound = len(bounds) - len(shut)
            if by_bound:
                lb = float(bounds.index_fill(0, torch.tensor(shut, dtype=torch.long), torch.inf).min())
                margin = lb if margin is None else min(margin, lb)
        q.margin, q.margin_over = margin, n_others + by_bound
        q.certified = q.margin_over == self.lm.vocab_size - len(cls) and margin is not None and margin > self.eps
        q.certified_by = None
        if q.certified:
            q.certified_by = "bound" if not n_others else "evaluated" if not by_bound else "evaluated+bound"
        near = classes[closest <= self.eps].tolist() if len(classes) else []
        q.also_within_eps = sorted(u for c in near for u in self.dups.members(c)) or None

    def _by_class(self, distances: dict[int, float]) -> tuple[Tensor, Tensor]:
        """Evaluated tokens {id: distance} -> (their classes [m] (representative ids), each class's closest
        distance [m]). A token evaluated stands for its whole class (bit-identical rows, identical states).
        Tensor ops, not a loop over the tokens: a GPU search of a weak ranker evaluates ~10⁵ tokens per
        position (random:llama-3.1-8b on an H100, layer 1: the loop took 2.6 of 6.4 s a prompt)."""
        if not distances:  # (most positions: only the accepted token was evaluated)
            return NO_CLASSES
        classes, which = self.dups.rep[torch.tensor(list(distances))].unique(return_inverse=True)
        closest = torch.full((len(classes),), torch.inf, dtype=torch.float64).scatter_reduce_(
            0, which, torch.tensor(list(distances.values()), dtype=torch.float64), "amin")
        return classes, closest


def chunks(wanted: list[tuple[int, Tensor]], rows: int) -> list[list[tuple[int, Tensor]]]:
    """Certifier.wanted's (t, candidates [n]) in parts of at most `rows` candidates in all (one pass each: the
    states of a whole vocabulary at every position would not fit in memory)."""
    out, space = [], 0
    for t, cand in wanted:
        while len(cand):
            if space == 0:
                out.append([])
                space = rows
            piece, cand = cand[:space], cand[space:]
            out[-1].append((t, piece))
            space -= len(piece)
    return out


class Queue:
    """Candidate ids from a policy's batches, each id at most once, skipping `seen` ones; when the
    policy runs out, the rest of the vocabulary in id order."""

    def __init__(self, batches, seen: Tensor):
        self.batches, self.seen = batches, seen
        self.buffer = torch.zeros(0, dtype=torch.long)
        self.taken = 0

    def take(self, n: int) -> Tensor | None:
        """Up to n ids (None when nothing is left or n ≤ 0)."""
        while len(self.buffer) == 0 and n > 0:
            batch = next(self.batches, None)
            if batch is None:
                batch = (~self.seen).nonzero().flatten()
                if len(batch) == 0:
                    return None
            batch = torch.as_tensor(batch, dtype=torch.long).cpu().flatten()
            batch = batch[~self.seen[batch]]
            unique, which = batch.unique(return_inverse=True)  # keep each id's first occurrence, in order
            first = torch.full((len(unique),), len(batch)).scatter_reduce_(0, which, torch.arange(len(batch)), "amin")
            self.buffer = batch[first.sort().values]
        if n <= 0:
            return None
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        self.seen[out] = True
        self.taken += len(out)
        return out
