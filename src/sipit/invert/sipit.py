"""SipIt: recover the exact prompt from the hidden states of all its positions at one layer.

The state at position t depends only on tokens 0..t (causality), so the prompt is recovered left to
right: with the prefix π = v_0..v_{t-1} verified, the token at t is the candidate v whose
recomputed state h_t(π ⊕ v) matches the observed ĥ_t (verify.py: relative distance ≤ ε). A
*policy* (policies.py) only orders the candidates; every accepted token is verified through the
tap, so a policy can make inversion slow but never wrong.

Two things make it fast:
- **speculation**: a policy may guess every remaining position at once. One pass of the guessed
  continuation on the verified prefix verifies every position before the first mismatch; its states
  after the mismatch (computed with one wrong token in their context) go back to the policy, which
  may revise its guesses there (Policy.revise) before the next pass. A row carries at most
  `speculate_tokens` guesses, twice as many after a row wholly right, all of them where the engine's
  guesses have been reliable (_guess): the tokens after a mismatch are wasted, and on a long prompt an
  uncapped row re-verifies the whole tail each time.
- **search with lookahead**: at a mismatch the policy's best few candidates are evaluated each
  followed by the guessed continuation, so the pass that fixes position t also verifies what
  follows. Later batches (candidates only) follow the policy's ranking and then, if it runs out,
  the rest of the vocabulary: a position is declared failed only after every token was tried
  (or certified impossible by the policy's lower bounds). A deep search's wide batches go through a
  bfloat16 draft of the model first (`draft`), and only the candidates it puts near the observation
  through the model; the others are verified last, if nothing else matched. A search whose nearest
  candidate is within NEAR·ε but not ε recomputes it once by a forward of the prompt's whole length
  (`_full_length`): numerical noise differs by position, and at a rare one the loop's cached and
  batched passes are off by more than ε where that forward is not. A search after a padding id was guessed and
  wrong, or with nothing within ε after PAD_CHECK_AFTER candidates or none left, tries the rest of the row as a
  right-padded batch's padding (`_right_padding`, one forward): where it is, the prompt ends there.

After recovery every accepted position gets its certificate (verify.py): the tokens most likely to
collide — near-duplicate embedding rows, tokens a lower bound cannot exclude — are always
evaluated, and `certify` ("top:K", "full") evaluates more, up to the whole vocabulary.

- **lock-step batches**: `invert_prompts` runs many prompts' loops side by side; each round, one
  forward pass serves every prompt's next pass (tap.extend_many), so a batch of B prompts costs
  about as many passes as its slowest prompt, each B times wider (flat or padded: tap.extend_many).
  A file goes through a window of B prompts in flight: as one finishes, the next starts.
  There a miss's lookahead gives the continuation to its best candidate only: the others go alone
  into a pass of short rows (a batch's pass costs its tokens; alone, one pass holds every row
  whatever their lengths); and the policies' deferred work (re-rankings after a miss, a search's
  first ranking) is done for the whole batch at once (SETTLE).

    engine = SipIt(lm, layer=15)                     # or SipIt(tap=some_tap)
    r = engine.invert_prompt(states)                 # states [T, tap.dim] -> PromptResult
    rs = engine.invert_prompts([s1, s2, s3])         # lock-step, one PromptResult each
    rs = engine.invert_prompts(many, window=32)      # at most 32 in flight
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from ..models import LM, LayerTap
from ..models.device import sync
from .certify import Certifier, Queue, chunks
from .config import InversionError, InvertConfig, batch_size_for, pass_tokens_for, speculate_tokens_for
from .result import Position, PromptResult, judge
from .verify import rel_distance


def _wants_draft(config: InvertConfig, tap) -> bool:
    """Whether searches are drafted: where asked (InvertConfig.draft), for plain layer states of a float32 model (a
    draft of a model already in bfloat16 would be itself). Not by default: at some positions the draft's ordering
    is wrong (SmolLM2 layer 30, position 1 of a random-id prompt: the true token far from the nearest drafted,
    3.4 s float32 only, 39 s drafted), though it saves a fifth of the time on random ids on average (draft_ab.txt)."""
    possible = type(tap) is LayerTap and not tap.final_norm and tap.lm.dtype == torch.float32 and tap.layer > 0
    return possible and bool(config.draft)


@dataclass
class _Run:
    """One prompt's state: its observed states, its own copy of the policy (begun on this prompt),
    cost counter, clock and what each position evaluated.

    The clock counts this prompt's own seconds: the time its loop runs, plus its share of every
    forward pass it shares with other prompts (by new tokens). Alone, that is the wall time; in a
    lock-step batch the prompts' seconds add up to the batch's, and a cap means the same as alone."""

    target: Tensor  # [T, dim]
    policy: object  # its own copy of the engine's policy, begun on this prompt (Policy.begin_many)
    max_seconds: float | None
    in_batch: bool = False  # inverted in lock-step with other prompts
    seconds: float = 0.0  # spent before the loop was last resumed
    resumed: float = 0.0  # perf_counter() when it was
    cost: dict = field(default_factory=lambda: dict(forward_tokens=0, backward_tokens=0, tap_calls=0, pass_seconds=0.0))
    evaluated: dict = field(default_factory=dict)  # t -> {candidate id: relative distance}
    row: int = 0  # guesses the next speculation row carries at most (_guess); set by _steps
    padding: tuple[int, int] | None = None  # (pad id, positions) of right padding found after the prompt (_search)

    def elapsed(self) -> float:
        return self.seconds + time.perf_counter() - self.resumed

    def capped(self) -> bool:
        return self.max_seconds is not None and self.elapsed() > self.max_seconds


@dataclass
class _Pass:
    """A forward pass the loop asks its driver for: groups of candidate rows [B_i, k_i], each appended to
    a verified prefix (one prefix for a search's groups; a certificate's differ). The driver answers with
    one (states [B_i, k_i, dim], grown(b, n) -> Prefix) per group; groups of different lengths or
    prefixes need not be padded to one another (tap.extend_many)."""

    requests: list[tuple[object, Tensor]]  # (prefix, rows [B_i, k_i])


SETTLE = "settle"  # what a loop yields to have its policy's deferred work done with the batch's
# A prompt's lookahead pass (a search's first, after a wrong guess) holds this many candidates where widened
# (SipIt._widen): the best carry the guessed continuation (InvertConfig.lookahead_tokens: 1-2 of them on a 20-token
# prompt), the rest go alone. Where a miss's true token is rarely the ranker's first after it (SmolLM2 layer 30: first
# in 21-39% of such positions, in the best 16 in 68-91%), the pass then finds it more often without the next: fresh
# seeds 523 / 541 / 547 / 557, widened always against never, median ratio 9.99 / 10.22 / 11.43 / 7.22 -> 9.28 / 9.72 /
# 10.73 / 7.40, passes a prompt 9.8 / 27.1 / 9.9 / 9.8 -> 8.6 / 25.9 / 9.1 / 8.7. At layer 15, where the carrying
# candidate is mostly right, the extra rows cost about what they save (seed 73: 2.45 -> 2.64), and in a lock-step
# batch, whose rounds cost their tokens whoever needs the next, they cost more (layer 15, B = 32, seed 5: 2.56 / 2.83
# -> 3.10 / 3.27); widened only where the carrying candidates have often been wrong: seed 73 2.44, 569 1.24 (never:
# 2.45, 1.24), layer 30 seed 563 7.97 (never 8.39, always 7.98). docs/results/invert/lookahead_batch_ab.py and .txt.
LOOKAHEAD_BATCH = 16
DRAFT_FROM = 256  # candidates in a search batch from which the draft screens it (the CPU's batch: a search's third)
DRAFT_NEAR = 0.1  # the draft's relative distance up to which a candidate goes on to the model (SmolLM2 layers 15 and
#                   30, draft_pass.py: the true token 0.013-0.023, every other ≥ 0.26)
DRAFT_KEEP = 8  # and after each drafted batch the nearest so many of all drafted so far go on (_drafted)
NEAR = 50  # a search batch with nothing within ε, the nearest candidate so far within NEAR·ε: that one is recomputed
#            by a full forward of the prompt's length, as the observation was most likely made (_full_length: once a
#            search). Numerical noise is not the same at every position: SmolLM2 layer 30, random ids (fresh seed 809,
#            prompt 22), position 1 after the token 46189 was 6e-4 to 1.3e-3 from the observation through the cache
#            and batches (ε 1.8e-4, measured on other prompts: eps.py), 0 through a forward of the prompt's 20 tokens;
#            the prompt failed after searching the whole vocabulary (length_noise.py). NEAR is ε's own headroom over
#            the measured noise (eps.FACTOR).


# A search asks whether the rest of the row is right padding (_right_padding: one forward) first where the wrong guess
# there was a padding id (a pad's state holds the pad's embedding, and the ranker guesses it: SmolLM2 layer 15, the
# first pad of 8 right-padded rows, the guess there the pad id in all 8), else with nothing within ε after this many
# (each costs about a position's forward: a deep search pays ~1/1000 more), not after sweeping the vocabulary (49,152
# candidates at SmolLM2's layer 30: minutes a row; Qwen2.5-1.5B's 151,936 at layer 14, over an hour).
PAD_CHECK_AFTER = 1024
# A 16-bit model's passes recompute a state only up to its rounding's path noise, and ε (4 × the largest measured:
# eps.HALF_FACTOR) reaches other tokens' distances (SmolLM2 in bfloat16, layer 30 after the final norm, seed 1231:
# ε 0.24, three wrong guesses accepted at 0.20-0.23 where the truth lay at 0.012-0.014, two reported ok). There a
# guess is accepted at once within SipIt.sure = ε/2 (twice the noise); a search's candidate within ε only as the nearest
# of at least CONFIRM candidates evaluated at its position, through a full forward of the prompt's length, where it is
# recomputed as the observation was (SmolLM2 bfloat16: the truth's full-length distance 0, the wrong 0.20).
CONFIRM = 256
# Nor are a 16-bit model's search passes computed as the observation was: attention kernels take their path by the
# sequence's length (torch's CPU flash attention: another softmax code under 8 keys than at 8 and more), and bfloat16
# carries the difference up the layers (SmolLM2 layer 15, fresh seed 1277, position 1 after ' spontaneous': the truth
# ' road', the ranker's 3rd, 5.2% from the observation in a search pass of 2 keys, 0 in any forward of 8 tokens or
# more; ' ramp', its 16th, 2.2% there and 19.5% in a full forward: ' ramp' was accepted, the prompt failed at 2). Its
# searches accept a token only through a full forward of the prompt's length (confirmed), the nearest there if within
# SipIt.sure: of each candidate within SipIt.sure in its pass at once, of those within ε once the nearest of CONFIRM
# (layer 30 after the final norm, fresh seed 1279: confirming those at once accepted 2 wrong tokens within ε/2 of a
# full forward before the truth was evaluated).


@dataclass
class _Search:
    """Outcome of a search at position t = prefix.length."""

    prefix: object  # grown by the positions found
    positions: list[Position]  # found (the first, then lookahead ones); one failed position if none passed
    next_checked: dict[int, float]  # candidates already evaluated at the next unverified position
    padding: tuple[int, int] | None = None  # (pad id, positions): t.. is a batch's right padding, the prompt ends at t


class SipIt:
    """The inversion loop for one tap and one policy; reusable across prompts."""

    name = "sipit"

    def __init__(self, lm: LM | None = None, layer: int | None = None, config: InvertConfig | None = None,
                 final_norm: bool = False, eps: float = 1e-4, tap=None):
        from .policies import make_policy

        self.tap = tap if tap is not None else LayerTap(lm, layer, final_norm=final_norm)
        self.lm, self.eps = self.tap.lm, eps
        self.sure = eps / 2 if self.lm.half else eps  # accepted at once within it (CONFIRM)
        config = config or InvertConfig()
        self.config = replace(config, batch_size=batch_size_for(config, self.lm.device),
                              speculate_tokens=speculate_tokens_for(config, self.lm.device),
                              pass_tokens=pass_tokens_for(config, self.lm.device))
        self.certifier = Certifier(self.tap, self.eps, self.config.certify, self.config.batch_size)
        self.drafts, self._draft = _wants_draft(self.config, self.tap), None  # (the draft tap: _draft_tap)
        self.pad_ids = self.lm.padding_ids if self.config.right_padding else []  # what a batch is padded with
        self.policy = make_policy(self.config.policy, self.tap, self.config)
        self.policy.eps = eps
        self.name = self.policy.name
        self.guessed = self.wrong = 0  # guesses speculation rows verified, over every prompt so far; wrong ones
        self.carried = self.carried_wrong = 0  # lookahead passes so far; those whose carrying candidates were all wrong
        self.calibration_seconds = getattr(self.policy, "calibration_seconds", 0.0)

    def invert_prompt(self, target: Tensor, true_ids: list[int] | None = None) -> PromptResult:
        """target [T, tap.dim] (observed states) -> PromptResult."""
        return self.invert_prompts([target], [true_ids])[0]

    def invert_prompts(self, targets: list[Tensor], true_ids: list | None = None, window: int | None = None,
                       done=None) -> list[PromptResult]:
        """Many prompts in lock-step: targets, a list of [T_i, tap.dim] -> one PromptResult each, in order.

        Each prompt runs its own loop (`_steps`) up to its next forward pass; one `tap.extend_many`
        then serves every prompt's pass together, so B prompts cost about as many passes as the
        slowest one alone, each pass B times wider. At most `window` prompts (default: all) are in
        flight: as one finishes the next starts, its first pass sharing the rounds of those still
        searching, so a file's prompts do not wait for the slowest of each chunk (lockstep_window_ab.py).
        Each prompt gets the ids and status it gets alone, for as many or fewer tokens from the same
        engine history (the lookahead, _search; first rows, _reliable); its seconds (and `max_seconds`)
        are its own share of the batch (_Run). done(i, result), if given, is called as prompt i finishes."""
        if window is not None and window < 1:
            raise InversionError(f"window must be at least 1 prompt in flight, got {window}")
        true_ids = true_ids if true_ids is not None else [None] * len(targets)
        window = min(window or len(targets), len(targets))
        runs: list = [None] * len(targets)
        loops: list = [None] * len(targets)
        results: list = [None] * len(targets)
        asks = {}  # prompt index -> the _Pass (or SETTLE) it waits for
        started = 0  # prompts 0..started-1 have begun

        def start(n: int) -> None:
            """Start the next n prompts: the policy's first look at them, shared like a forward pass."""
            nonlocal started
            new = range(started, min(started + n, len(targets)))
            started = new.stop
            for i in new:
                runs[i] = _Run(targets[i].to(self.lm.dtype).to(self.lm.device), None, self.config.max_seconds,
                               window > 1)
            finite = [runs[i] for i in new if torch.isfinite(runs[i].target).all()]  # (the others fail at once)
            t = time.perf_counter()
            begun = self.policy.begin_many([r.target for r in finite], [r.cost for r in finite])
            share = (time.perf_counter() - t) / max(len(finite), 1)
            for run, policy in zip(finite, begun):
                run.policy, run.seconds = policy, share
            for i in new:
                loops[i] = self._steps(runs[i], true_ids[i])
                self._resume(i, runs[i], loops[i], None, asks, results, done)

        start(window)
        while asks or started < len(targets):
            if len(asks) < window and started < len(targets):  # prompts finished: the next take their places
                start(window - len(asks))
                continue
            settling = [i for i, ask in asks.items() if ask is SETTLE]
            if settling:  # the policies' deferred work, for every prompt that needs it at once
                t = time.perf_counter()
                type(self.policy).settle_many([runs[i].policy for i in settling])
                share = (time.perf_counter() - t) / len(settling)
                for i in settling:
                    runs[i].seconds += share
                    self._resume(i, runs[i], loops[i], None, asks, results, done)
                continue
            pending = list(asks.items())
            requests = [r for _, p in pending for r in p.requests]
            longest = max(prefix.length for prefix, _ in requests)  # (a pass's tokens each hold a prefix's cache)
            t = time.perf_counter()
            served = iter(self.tap.extend_many(requests, self.tap.rows_that_fit(longest + 1, self.config.pass_tokens)))
            sync(self.lm.device)  # a GPU pass's time is the pass's, not the first reader's (pass_seconds)
            share = (time.perf_counter() - t) / sum(rows.numel() for _, rows in requests)
            for i, p in pending:
                spent = share * sum(rows.numel() for _, rows in p.requests)
                runs[i].seconds += spent
                runs[i].cost["pass_seconds"] += spent
                self._resume(i, runs[i], loops[i], [next(served) for _ in p.requests], asks, results, done)
        return results

    @staticmethod
    def _resume(i, run, loop, answer, asks, results, done=None) -> None:
        """Run prompt i's loop up to its next request (a _Pass or SETTLE, recorded in asks) or its result,
        on its clock (then done(i, result), if given)."""
        run.resumed = time.perf_counter()
        try:
            asks[i] = loop.send(answer)
        except StopIteration as finished:
            asks.pop(i, None)
            results[i] = finished.value
            run.target = None  # (freed: a file's prompts are not all kept on the device)
        run.seconds += time.perf_counter() - run.resumed
        if results[i] is not None and done is not None:
            done(i, results[i])

    def _steps(self, run: _Run, true_ids):
        """One prompt's loop: yields _Pass requests, receives their answers, returns a PromptResult."""
        policy = run.policy
        T = run.target.shape[0]
        bad = (~torch.isfinite(run.target).all(-1)).nonzero().flatten().tolist()
        if bad:
            return self._finish(run, [], [], f"non-finite values (NaN/inf) in the states at positions {bad[:10]}",
                                true_ids)
        prefix = self.tap.prefill(torch.zeros(0, dtype=torch.long, device=self.lm.device))
        positions: list[Position] = []
        run.row = T if self._reliable(T) else self.config.speculate_tokens
        checked: dict[int, float] = {}  # candidates already evaluated at position t -> distance
        why, no_match = "", False  # why the prompt failed, if it does; whether no token was within ε
        while prefix.length < T:
            t = prefix.length
            yield from self._settle(run)
            guess = self._guess(run, policy, t, prefix)
            bounds = policy.lower_bounds(t)
            if guess is not None and bounds is not None and bounds[guess[0]] > self.eps:
                checked = {int(guess[0]): float(bounds[guess[0]])}  # certified wrong: no pass needed
            if guess is not None and int(guess[0]) not in checked:
                prefix, accepted, miss = yield from self._speculate(run, prefix, guess)
                positions += accepted
                if prefix.length == T:
                    break
                if len(accepted) == len(guess):  # a capped row wholly right: the next may be twice as long
                    checked, run.row = {}, 2 * run.row
                    continue
                run.row = self.config.speculate_tokens
                checked = {int(guess[len(accepted)]): miss}
            policy.prepare(prefix.length)
            yield from self._settle(run)  # (the revisions after a wrong guess, the search's first ranking)
            if guess is not None:
                guess = self._guess(run, policy, prefix.length, prefix)  # revised after the wrong guess
            found = yield from self._search(run, prefix, checked, guess[1:] if guess is not None else None)
            prefix, checked = found.prefix, found.next_checked
            positions += found.positions
            if found.padding is not None:  # the prompt ends here
                run.padding = found.padding
                break
            if positions[-1].token is None:
                q, t = positions[-1], len(positions) - 1  # the failed position (speculation may have moved past t)
                no_match = not run.capped()
                why = (f"time cap of {self.config.max_seconds:g}s reached at position {t} ({q.tried} candidates "
                       "tried there)" if not no_match else
                       f"no token within eps={self.eps:g}{self._sure_note()} at position {t} (best relative "
                       f"distance {q.distance:.3g}); "
                       "wrong model, layer, norm setting or precision (--precision: a bfloat16 model's states lie "
                       "~1% from float32's), a padded batch's padding (give its attention_mask), or not a state of "
                       "a token sequence?")
                break
        # the verified positions (all, or those before a failure) get their certificates: what they still need
        # evaluated goes in requests of a pass each, every position on its part of the recovered prefix's cache
        wanted = self.certifier.wanted(prefix, positions, run.evaluated, policy)
        for part in chunks(wanted, self.tap.rows_that_fit(prefix.length + 1, self.config.pass_tokens)):
            answers = yield from self._extend_many(run, self.certifier.requests(prefix, part))
            self.certifier.record(run.target, part, [h[:, 0] for h, _ in answers], positions, run.evaluated)
        self.certifier.fill(positions, run.evaluated, policy)
        near = [s for s, q in enumerate(positions[:-1]) if q.also_within_eps]
        if no_match and near:  # a wrong but within-ε token earlier explains the failure too
            why += (f" Or the prefix is not the prompt's: other tokens were also within eps at positions {near}, "
                    "so the observation does not pin those positions at this eps (too coarse: low-precision "
                    "storage, noise) and the accepted one may be wrong.")
        return self._finish(run, prefix.ids.tolist(), positions, why, true_ids)

    def _sure_note(self) -> str:
        """What eps means for a 16-bit model (CONFIRM), in a failure's message."""
        return f" (a 16-bit model's token: a guess within {self.sure:g} in its pass, a search's within that in a full " \
            f"forward of the prompt, beyond it in its pass once {CONFIRM} were tried)" if self.lm.half else ""

    def _reliable(self, T: int) -> bool:
        """Whether this engine's guesses have been right often enough that a T-token prompt's first row
        should carry every guess: fewer than one wrong guess expected in two such prompts (estimated with
        one wrong and two guesses added, so an engine without history caps). SmolLM2 at layer 1 has none
        wrong; at 15 about 1 in 25."""
        return 2 * T * (self.wrong + 1) < self.guessed + 2

    def _widen(self, run: _Run) -> bool:
        """Whether a lookahead pass takes the next best candidates alone too (LOOKAHEAD_BATCH): for a prompt alone,
        where the candidates that carry the continuation have been wrong in a third of this engine's lookaheads or
        more (SmolLM2: most at layer 30, about 1 in 4 at 15, where the extra rows cost about what they save)."""
        return not run.in_batch and 3 * self.carried_wrong >= self.carried + 1

    def _guess(self, run: _Run, policy, t: int, prefix):
        """The policy's guessed ids for positions t.. [≤ run.row], or None (no guesses, or speculation off).

        A wrong guess wastes the tokens a row computed after it, and the next row carries the rest again:
        uncapped, a long prompt's passes re-verify its tail at every wrong guess. Capped rows cost more
        passes where guesses are right, so a row wholly right doubles the next, and a prompt's first row
        carries every guess where the engine's guesses have been reliable (_reliable). SmolLM2 on a CPU,
        200-token bench prompts of fresh seeds, median ratio to the forward, uncapped → capped: ℓ = 15 5.35 /
        5.92 / 6.00 → 4.50 / 4.96 / 4.30, ℓ = 30 42.1 → 27.8; ℓ = 1, where no guess is wrong, 2.65 → 2.99
        with every first row capped, 2.60 with _reliable (32 and the doubling chosen on seed 5:
        docs/results/invert/speculate_tokens.py)."""
        if not self.config.speculate:
            return None
        guess = policy.guesses(t, prefix.ids)
        return guess if guess is None else guess[:run.row]

    def _finish(self, run: _Run, ids, positions, message, true_ids) -> PromptResult:
        status, message = judge(positions, self.eps, message)
        run.policy, run.evaluated = None, {}  # (its anchors, kept LM rows and distances: freed now, not with the batch)
        T, pad, right = run.target.shape[0], *(run.padding or (None, 0))
        if true_ids is not None and right and list(true_ids[T - right:]) == [pad] * right:
            true_ids = true_ids[:T - right]  # (the file's input_ids hold the padding too)
        return PromptResult(ids=ids, text=self.lm.decode(ids) if ids else "", status=status, positions=positions,
                            seconds=run.elapsed(), length=T - right, message=message, right_padding=right,
                            true_ids=list(true_ids) if true_ids is not None else None, **run.cost).check()

    @staticmethod
    def _settle(run: _Run):
        """In a lock-step batch, let the driver settle the policy's deferred work (Policy.settle_many)
        together with the other prompts' (a generator step); alone, `guesses` does it."""
        if run.in_batch and run.policy.deferred:
            yield SETTLE

    # -- the two kinds of forward pass ---------------------------------------------------------

    def _extend(self, run: _Run, prefix, *rows: Tensor):
        """rows [B_i, k_i] each, on the prefix -> one (states [B_i, k_i, dim], grown(b, n) -> Prefix) per
        group, from the driver (a generator step)."""
        return (yield from self._extend_many(run, [(prefix, r) for r in rows]))

    def _extend_many(self, run: _Run, requests: list):
        """(prefix, rows [B_i, k_i]) each -> `_extend`'s answers, in one request to the driver."""
        run.cost["forward_tokens"] += sum(r.numel() for _, r in requests)
        run.cost["tap_calls"] += 1
        return (yield _Pass(requests))

    def _speculate(self, run: _Run, prefix, guess: Tensor):
        """Verify guessed ids [k] for positions t.. in one pass; accept the leading matches.

        -> (grown prefix, accepted positions, distance of the first wrong guess (nan if none))."""
        t = prefix.length
        (h, grown), = yield from self._extend(run, prefix, guess[None])
        d = rel_distance(h[0], run.target[t:t + len(guess)]).cpu()
        n = int((d <= self.sure).long().cumprod(0).sum())
        self.guessed, self.wrong = self.guessed + min(n + 1, len(d)), self.wrong + (n < len(d))
        if n < len(d):  # the first wrong guess was computed on a verified prefix: tell the policy
            run.policy.observe(t + n, guess[n:n + 1], h[0, n:n + 1])
            run.policy.revise(t + n + 1, guess[n + 1:], h[0, n + 1:])  # the rest came after a wrong token
        accepted = [Position(int(v), float(dv), None, 0, tried=1, via="speculation")
                    for v, dv in zip(guess[:n].tolist(), d[:n].tolist())]  # (lists: 20 tensor elements took 44 µs)
        return grown(0, n), accepted, float(d[n]) if n < len(d) else float("nan")

    def _search(self, run: _Run, prefix, checked: dict[int, float], continuation: Tensor | None) -> _Search:
        """Find the token at position t = prefix.length in the policy's order, then everything else.

        The first batch carries the guessed continuation (lookahead): the best candidates (lookahead_tokens of
        them with it; only the best in a lock-step batch: SmolLM2 ℓ = 15, 32 seed-5 prompts, 1,545 → 1,149
        tokens, the batch 4.8 → 3.8 batched forwards; the first candidate was right in 20 of 26 lookaheads),
        and where widened (_widen) the next up to LOOKAHEAD_BATCH without it."""
        t, V, cfg = prefix.length, self.lm.vocab_size, self.config
        fits = self.tap.rows_that_fit(t + 1, cfg.batch_size)  # (a GPU's memory holds fewer on long prefixes)
        seen = torch.zeros(V, dtype=torch.bool)
        seen[list(checked)] = True
        bounds = run.policy.lower_bounds(t)
        if bounds is not None:
            seen |= bounds.cpu() > self.eps  # certified: these cannot pass
        queue = Queue(run.policy.candidates(t, prefix), seen)
        evaluated = run.evaluated[t] = dict(checked)
        limit = cfg.max_candidates or V
        lookahead = continuation is not None and len(continuation) > 0 and cfg.lookahead_tokens > 0
        n_batches = 0
        drafts, far = self.drafts, {}  # far: candidates the draft put far from the observation {id: its distance}
        nearest = min(checked.items(), key=lambda item: item[1], default=(None, float("inf")))  # (id, distance)
        rechecked = False  # whether the nearest went through a full forward (_full_length) in this search
        within: dict[int, float] = {}  # a 16-bit model's candidates within ε in their pass, not yet confirmed
        full_checked = set()  # those that went through a full forward (confirmed)
        pads_checked = False  # whether the rest of the row was tried as right padding (_right_padding) in this search
        draft_prefix = []  # the prefix through the draft, made at the search's first drafted batch

        def recheck() -> _Search | None:
            """Where nothing passed: the nearest candidate so far, if within NEAR·ε, through a full forward
            (_full_length), once a search; found where within SipIt.sure there (a 16-bit model's: once the nearest of
            CONFIRM candidates). -> found, or None."""
            nonlocal rechecked
            if rechecked or nearest[1] > NEAR * self.eps or nearest[0] in full_checked:
                return None
            if self.lm.half and nearest[1] > self.sure and len(evaluated) + len(far) < min(CONFIRM, limit):
                return None  # (a 16-bit model's: not yet the nearest of enough)
            rechecked, v = True, nearest[0]
            full, grown = self._full_length(run, prefix, v, continuation)
            if full > self.sure:
                return None
            evaluated[v] = full
            return _Search(grown, [Position(v, full, None, 0, tried=len(evaluated) + len(far), via="full-length",
                                            drafted=len(far))], {})

        def confirmed(enough: bool) -> _Search | None:
            """A 16-bit model's search: its candidates within SipIt.sure in their passes, and once the nearest of CONFIRM
            (`enough`) those within ε, each through a full forward of the prompt's length (_full_length); the nearest
            there found if within SipIt.sure. -> found, or None."""
            nonlocal nearest
            best = None
            for v, x in sorted(within.items(), key=lambda item: item[1]):
                if x > self.sure and not enough:
                    break
                del within[v]
                full, grown = self._full_length(run, prefix, v, continuation)
                evaluated[v] = full
                full_checked.add(v)
                if v == nearest[0]:  # (its full distance: a later batch's nearest may replace it)
                    nearest = (v, full)
                if full <= self.sure and (best is None or full < best[1]):
                    best = (v, full, grown)
            return None if best is None else _Search(best[2], [Position(
                best[0], best[1], None, 0, tried=len(evaluated) + len(far), via="full-length", drafted=len(far))], {})

        def right_padded() -> _Search | None:
            """Where nothing passed: the rest of the row as right padding (_right_padding), once a search. -> found,
            or None."""
            nonlocal pads_checked
            if pads_checked or t == 0:
                return None
            pads_checked = True
            padding = self._right_padding(run, prefix)
            return _Search(prefix, [], {}, padding) if padding is not None else None

        if any(v in checked for v in self.pad_ids) and (hit := right_padded()):  # (a padding id guessed, and wrong)
            return hit
        while not run.capped():
            left = limit - len(evaluated) - len(far)
            if left <= 0:
                batch = None
            elif lookahead:
                best = max(1, cfg.lookahead_tokens // (1 + len(continuation)))  # as many as the tokens allow
                carry = 1 if run.in_batch else best  # those that carry the continuation
                widened = self._widen(run)
                batch = queue.take(max(best, LOOKAHEAD_BATCH) if widened else best)
                # a widened lookahead is the search's first batch, so the next takes 64, not 16 again (layer 30,
                # fresh seeds 571 / 577 / 587: passes a prompt 7.0 / 9.7 / 7.4 -> 6.7 / 9.2 / 7.0, medians 7.87 /
                # 9.55 / 9.64 -> 7.87 / 9.63 / 9.48; lookahead_batch_ab.txt)
                n_batches = int(widened)
            else:
                batch = queue.take(min(fits, cfg.first_batch * 4 ** n_batches, left))
                n_batches += 1
            if batch is None and far:  # nothing near matched: the draft's far ones, nearest first, through the model
                rest = torch.ones(V, dtype=torch.bool)
                rest[list(far)] = False
                queue, drafts, far = Queue(iter([torch.tensor(sorted(far, key=far.get))]), rest), False, {}
                continue
            if batch is None:
                break
            if drafts and not lookahead and len(batch) >= DRAFT_FROM:
                batch = self._drafted(run, prefix, draft_prefix, batch, far)
                if len(batch) == 0:
                    continue
            if lookahead:  # (the rest alone: in a lock-step batch, a pass of short rows)
                groups = [torch.cat([batch[:carry, None], continuation.cpu().expand(min(carry, len(batch)), -1)], 1),
                          batch[carry:, None]]
            else:
                groups = [batch[:, None]]
            answers = yield from self._extend(run, prefix, *[g for g in groups if len(g)])
            rows = [(h, grown, j) for h, grown in answers for j in range(len(h))]  # one per candidate
            h0 = torch.cat([h[:, 0] for h, _ in answers])  # [B, dim]: each candidate's state at t
            run.policy.observe(t, batch, h0)
            d = rel_distance(h0, run.target[t]).cpu()  # [B]
            evaluated.update(zip(batch.tolist(), d.tolist()))
            passing = (d <= self.sure).nonzero().flatten()
            if len(d) and float(d.min()) < nearest[1]:
                nearest = (int(batch[int(d.argmin())]), float(d.min()))
            if lookahead:
                self.carried += 1
                self.carried_wrong += not bool((passing < carry).any())
            if self.lm.half:  # (its pass only chooses what a full forward confirms: below CONFIRM)
                within.update((v, x) for v, x in zip(batch.tolist(), d.tolist()) if x <= self.eps)
                if (hit := confirmed(len(evaluated) + len(far) >= min(CONFIRM, limit))) is not None:
                    return hit
                passing = passing[:0]
            if not len(passing) and (hit := recheck()) is not None:  # (the nearest may be a wrong guess's)
                return hit
            if not len(passing) and len(evaluated) + len(far) >= PAD_CHECK_AFTER and (hit := right_padded()):
                return hit
            if len(passing):
                b = int(passing[d[passing].argmin()])
                h, grown, j = rows[b]
                found = [Position(int(batch[b]), float(d[b]), None, 0, tried=len(evaluated) + len(far),
                                  via="lookahead" if lookahead else "search", drafted=len(far))]
                n, nxt = 1, {}
                if h.shape[1] > 1:  # the row carried the continuation, computed on a verified prefix
                    dc = rel_distance(h[j, 1:], run.target[t + 1:t + h.shape[1]]).cpu()  # [k - 1]
                    n += int((dc <= self.sure).long().cumprod(0).sum())
                    found += [Position(int(v), float(dv), None, 0, tried=1, via="lookahead")
                              for v, dv in zip(continuation[:n - 1].tolist(), dc[:n - 1].tolist())]
                    if n - 1 < len(continuation):
                        nxt = {int(continuation[n - 1]): float(dc[n - 1])}
                        run.policy.observe(t + n, continuation[n - 1:n], h[j, n:n + 1])
                        run.policy.revise(t + n + 1, continuation[n:], h[j, n + 1:])
                return _Search(grown(j, n), found, nxt)
            lookahead = False
        # nothing within ε and no batch was checked after: every token excluded by its lower bound without a pass
        # (position 0: a first token whose table distance noise put over ε, guessed and so nearest, the rest far)
        if not run.capped() and (hit := recheck() or right_padded()) is not None:
            return hit
        best = min(evaluated.values(), default=float("inf"))
        if bounds is not None:  # certified lower bounds of the tokens never evaluated
            best = min(best, float(bounds.min()))
        return _Search(prefix, [Position(None, best, None, 0, tried=len(evaluated) + len(far), via="search")], {})

    def _full_length(self, run: _Run, prefix, v: int, continuation: Tensor | None):
        """Candidate v at t = prefix.length through one full forward of the prompt's length T (the verified prefix,
        v, then the guessed continuation or v again: position t does not depend on what follows), the shape the
        observation was most likely computed in, where the loop's passes (a cache, rows of other lengths, batches)
        put it within NEAR·ε but not ε (NEAR). Outside the driver's rounds (a rare pass: in a lock-step batch the
        others wait for it). -> (its relative distance, the prefix grown by v, from this pass's cache)"""
        T, t = run.target.shape[0], prefix.length
        after = continuation.cpu()[:T - t - 1] if continuation is not None else torch.zeros(0, dtype=torch.long)
        after = torch.cat([after, torch.full((T - t - 1 - len(after),), v)])
        start = time.perf_counter()
        whole, h = self.tap.prefill(torch.cat([prefix.ids.cpu(), torch.tensor([v]), after]), return_states=True)
        sync(self.lm.device)
        run.cost["forward_tokens"] += T
        run.cost["tap_calls"] += 1
        run.cost["pass_seconds"] += time.perf_counter() - start
        return float(rel_distance(h[t:t + 1], run.target[t])[0]), whole.crop(t + 1)

    def _right_padding(self, run: _Run, prefix) -> tuple[int, int] | None:
        """Whether positions t = prefix.length.. of the row are a right-padded batch's padding after the verified
        prefix, its mask not given: a pad attends to the prompt's keys only (the mask hides every pad's, its own too),
        so no appended token's state matches it, and the search would sweep the vocabulary and fail. One forward of
        the prefix followed by T - t of each of lm.padding_ids, those positions masked, at the positions a plain
        forward gives them (0..T-1) and those generate() does (0). -> (pad id, T - t) where every position is within
        ε, else None."""
        T, t, pads = run.target.shape[0], prefix.length, self.pad_ids
        if not pads:
            return None
        plain = torch.arange(T)
        rows = [(v, at) for v in pads for at in (plain, plain.masked_fill(plain >= t, 0))]  # (generate(): pads at 0)
        ids = torch.stack([torch.cat([prefix.ids.cpu(), torch.full((T - t,), v)]) for v, _ in rows])  # [R, T]
        mask = (plain < t).long().expand(len(rows), T)
        start = time.perf_counter()
        h = self.tap.states(ids, attention_mask=mask, position_ids=torch.stack([at for _, at in rows]))[:, t:]
        # h: [R, T - t, dim]
        sync(self.lm.device)
        run.cost["forward_tokens"] += ids.numel()
        run.cost["tap_calls"] += 1
        run.cost["pass_seconds"] += time.perf_counter() - start
        within = (rel_distance(h, run.target[t:]) <= self.eps).all(-1).cpu()  # [R]
        return (rows[int(within.nonzero()[0])][0], T - t) if within.any() else None

    def _drafted(self, run: _Run, prefix, draft_prefix: list, batch: Tensor, far: dict) -> Tensor:
        """The candidates at t = prefix.length that go on through the model: those of batch [B] whose state
        through the bfloat16 draft lies within DRAFT_NEAR of the observation (relative), nearest first, then the
        DRAFT_KEEP nearest of every candidate drafted so far in this search, whatever their distance (the draft's
        error varies: SmolLM2 layer 30, random ids, the true token's draft state 0.15-0.18 from the observation at
        positions where every other's was further still; waiting for the whole vocabulary to be drafted before
        verifying them cost up to 40 s a prompt). The others go into far {id: distance} and, as anchors, to the
        policy. The draft's pass is the engine's own, outside any lock-step round (SmolLM2, 256 candidates: layer
        15 67 vs 150 ms in float32, layer 30 141 vs 317 ms: draft_pass.py). draft_prefix: [] or [the prefix
        through the draft], kept by the search."""
        draft, t = self._draft_tap(), prefix.length
        if not draft_prefix:
            draft_prefix.append(draft.prefill(prefix.ids))
        h = draft.extend(draft_prefix[0], batch[:, None].to(draft.lm.device))[:, 0].float()  # [B, dim]
        d = rel_distance(h, run.target[t].float()).cpu()  # [B]
        near = d <= DRAFT_NEAR
        far.update(zip(batch[~near].tolist(), d[~near].tolist()))
        run.policy.observe(t, batch[~near], h[~near.to(h.device)])
        nearest = heapq.nsmallest(DRAFT_KEEP, far, key=far.get)  # of all drafted so far: an error that hides the
        for u in nearest:  # true token (position 1 of a prompt: 0.18) still leaves it among the nearest
            del far[u]
        return torch.cat([batch[near][d[near].argsort()], torch.tensor(nearest, dtype=torch.long)])

    def _draft_tap(self) -> LayerTap:
        """The tap on a bfloat16 copy of the model, made at the first drafted batch (the copy costs half the
        model's memory: only engines whose searches go deep pay it)."""
        if self._draft is None:
            self._draft = LayerTap(self.lm.copy_in(torch.bfloat16), self.tap.layer)
        return self._draft
