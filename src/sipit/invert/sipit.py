"""SipIt: recover the exact prompt from the hidden states of all its positions at one layer.

The state at position t depends only on tokens 0..t (causality), so the prompt is recovered left to
right: with the prefix π = v_0..v_{t-1} verified, the token at t is the candidate v whose
recomputed state h_t(π ⊕ v) matches the observed ĥ_t (verify.py: relative distance ≤ ε). A
*policy* (policies.py) only orders the candidates; every accepted token is verified through the
layer tap, so a policy can make inversion slow but never wrong.

Two things make it fast:
- **speculation**: a policy may guess every remaining position at once. One pass of the guessed
  continuation on the verified prefix verifies every position before the first mismatch.
- **search with lookahead**: at a mismatch the policy's best few candidates are evaluated each
  followed by the guessed continuation, so the pass that fixes position t also verifies what
  follows. Later batches (candidates only) follow the policy's ranking and then, if it runs out,
  the rest of the vocabulary: a position is declared failed only after every token was tried
  (or certified impossible by the policy's lower bounds).

    result = invert(lm, states, layer=15)            # states [T, d], [B, T, d] or a list of [T_i, d]
    result.prompts[0].ids, result.prompts[0].status  # recovered ids, "ok" | "ambiguous" | "failed"
    result.summary()                                 # accuracy, seconds per prompt, cost
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from ..io import SipitError
from ..models import LM, LayerTap, ModelError, load_model
from .verify import DuplicateClasses, rel_distance, tolerance


class InversionError(SipitError, ValueError):
    """Input that cannot be inverted at all (shape, emptiness); the message says why."""


@dataclass
class InvertConfig:
    policy: str = "learned"  # exhaustive | random | gradient | learned (policies.py), or a Policy class
    eps: float | None = None  # relative acceptance threshold; None: verify.tolerance(states dtype)
    batch_size: int = 256  # candidates per forward pass when searching a position
    speculate: bool = True  # verify a policy's whole-sequence guesses in one pass, if it makes any
    lookahead_tokens: int = 32  # first search batch: candidates × (1 + guessed continuation) tokens
    first_batch: int = 16  # then candidate batches of 16, 64, 256, ... up to batch_size
    max_candidates: int | None = None  # per position; None: the whole vocabulary before failing
    max_seconds: float | None = None  # per prompt wall-clock cap; a capped prompt ends "failed" (message says so)
    seed: int = 0  # random policy
    grad_steps: int = 200  # gradient policy: steps before falling back to exhaustive order
    grad_lr: float = 0.1  # gradient policy: Adam step, relative to the mean embedding norm
    grad_snap_every: int = 1  # gradient policy: propose candidates every K steps
    grad_snap_k: int = 8  # gradient policy: nearest unvisited rows proposed per snap
    calibration_tokens: int = 49_152  # learned policy: text + random-id tokens to fit on (one-time)
    certify: int = 0  # after recovery, evaluate this many top-ranked alternatives at every position
    #                   whose margin covers fewer (speculated positions: none); costs ~T/2 forward passes


@dataclass
class Position:
    """One recovered (or failed) position. Distances are relative (verify.py)."""

    token: int | None  # accepted id; None if nothing within ε
    distance: float  # of the accepted token (or, if failed, the best candidate evaluated)
    margin: float | None  # relative distance of the best other candidate (outside the token's class)
    margin_over: int  # how many other tokens the margin covers (evaluated or certified by bounds)
    tried: int  # candidates evaluated by a forward pass at this position
    via: str  # "speculation" | "lookahead" | "search"
    duplicates: list[int] | None = None  # the token's class of identical embedding rows, if > 1
    also_within_eps: list[int] | None = None  # other (non-duplicate) tokens within ε: a near-collision


@dataclass
class PromptResult:
    ids: list[int]  # recovered ids (up to the first failed position)
    text: str
    status: str  # "ok" | "ambiguous" (duplicate class or near-collision) | "failed"
    positions: list[Position]
    seconds: float
    forward_tokens: int = 0  # tokens pushed through the tap (a full forward of the prompt = T)
    backward_tokens: int = 0  # tokens also back-propagated (gradient policy)
    tap_calls: int = 0
    length: int = 0  # T, number of observed positions
    message: str = ""
    true_ids: list[int] | None = None
    exact: bool | None = None  # every position recovered and equal to true_ids up to duplicates
    loss_curve: list[float] | None = None  # optimisation baselines (hardprompts): loss at every step

    @property
    def forward_equivalents(self) -> float:
        """Cost in full forward passes of the prompt: (forward + 2 × backward tokens) / T."""
        return (self.forward_tokens + 2 * self.backward_tokens) / max(self.length, 1)

    def to_json(self) -> dict:
        d = asdict(self)
        d["forward_equivalents"] = round(self.forward_equivalents, 3)
        return d


@dataclass
class InversionResult:
    model: str
    layer: int
    final_norm: bool
    policy: str
    eps: float
    prompts: list[PromptResult] = field(default_factory=list)
    seconds: float = 0.0  # inversion only
    calibration_seconds: float = 0.0  # one-time policy setup (0 when loaded from cache)
    vocab_size: int = 0

    @property
    def ok(self) -> bool:
        return all(p.status != "failed" for p in self.prompts)

    def summary(self) -> dict:
        P = self.prompts
        positions = [q for p in P for q in p.positions]
        n_pos = sum(p.length for p in P)
        recovered = sum(q.token is not None for q in positions)
        known = [p for p in P if p.true_ids is not None]
        correct = sum(_n_correct(p) for p in known)
        secs = sorted(p.seconds for p in P)
        tried = [q.tried for q in positions]
        return dict(
            model=self.model, layer=self.layer, final_norm=self.final_norm, policy=self.policy,
            eps=self.eps, prompts=len(P), positions=n_pos,
            ok=sum(p.status == "ok" for p in P), ambiguous=sum(p.status == "ambiguous" for p in P),
            failed=sum(p.status == "failed" for p in P),
            recovered_positions=recovered,
            token_accuracy=correct / max(sum(p.length for p in known), 1) if known else None,
            exact_match_rate=sum(bool(p.exact) for p in known) / len(known) if known else None,
            seconds_total=round(self.seconds, 3),
            seconds_per_prompt_median=round(secs[len(secs) // 2], 4) if secs else None,
            seconds_per_prompt_mean=round(sum(secs) / len(secs), 4) if secs else None,
            calibration_seconds=round(self.calibration_seconds, 2),
            candidates_per_position=round(sum(tried) / max(len(tried), 1), 3),
            vocab_explored_pct=round(100 * sum(tried) / max(len(tried), 1) / max(self.vocab_size, 1), 5),
            forward_equivalents_per_prompt=round(sum(p.forward_equivalents for p in P) / max(len(P), 1), 3),
            tap_calls_per_prompt=round(sum(p.tap_calls for p in P) / max(len(P), 1), 3),
            speculated_positions_pct=round(100 * sum(q.via in ("speculation", "lookahead") for q in positions) / max(len(positions), 1), 2),
        )

    def to_jsonl(self) -> str:
        return "".join(json.dumps(p.to_json()) + "\n" for p in self.prompts)


def _n_correct(p: PromptResult) -> int:
    n = 0
    for q, true in zip(p.positions, p.true_ids):
        n += q.token is not None and (q.token == true or true in (q.duplicates or []))
    return n


# ----------------------------------------------------------------------------------------------


class SipIt:
    """The inversion loop for one (model, layer, norm) and one policy; reusable across prompts."""

    def __init__(self, lm: LM, layer: int, config: InvertConfig | None = None, final_norm: bool = False,
                 eps: float | None = None, tap=None):
        from .policies import make_policy

        self.lm, self.config = lm, config or InvertConfig()
        self.tap = tap or LayerTap(lm, layer, final_norm=final_norm)  # any surface tap (models/surfaces.py)
        self.eps = eps if eps is not None else (self.config.eps or tolerance(torch.float32))
        self.dups = duplicate_classes(lm)
        t0 = time.perf_counter()
        self.policy = make_policy(self.config.policy, self.tap, self.config)
        self.setup_seconds = time.perf_counter() - t0
        self.calibration_seconds = getattr(self.policy, "calibration_seconds", 0.0)

    # -- one prompt ----------------------------------------------------------------------------

    def invert_prompt(self, target: Tensor, true_ids: list[int] | None = None) -> PromptResult:
        """target [T, d] (observed states) -> PromptResult."""
        t0 = self._t0 = time.perf_counter()
        self._cost = dict(forward_tokens=0, backward_tokens=0, tap_calls=0)
        self.policy.cost = self._cost
        T = target.shape[0]
        target = target.to(self.lm.dtype)
        bad = (~torch.isfinite(target).all(-1)).nonzero().flatten().tolist()
        if bad:
            return self._finish(t0, [], [], "failed", T, true_ids,
                                f"non-finite values (NaN/inf) in the states at positions {bad[:10]}")
        self.target = target
        self.policy.begin(target)
        prefix = self.tap.prefill(torch.zeros(0, dtype=torch.long))
        positions: list[Position] = []
        checked: dict[int, float] = {}  # candidates already evaluated at position t -> distance
        t = 0
        while t < T:
            guess = self.policy.guesses(t, prefix.ids) if self.config.speculate else None
            bounds = self.policy.lower_bounds(t)
            if guess is not None and bounds is not None and bounds[guess[0]] > self.eps:
                checked = {int(guess[0]): float(bounds[guess[0]])}  # certified wrong: no pass needed
            if guess is not None and int(guess[0]) not in checked:
                prefix, accepted = self._speculate(prefix, guess)
                positions += accepted
                t = prefix.length
                if t == T:
                    break
                guess = guess[len(accepted):]
                checked = {int(guess[0]): self._last_distance}
            continuation = guess[1:] if guess is not None else None
            prefix, found, checked = self._search(prefix, checked, continuation)
            positions += found
            if not found or found[-1].token is None:
                if self._capped():
                    return self._finish(t0, prefix.ids.tolist(), positions, "failed", T, true_ids,
                                        f"time cap of {self.config.max_seconds:g}s reached at position {t} "
                                        f"({found[-1].tried} candidates tried there)")
                return self._finish(t0, prefix.ids.tolist(), positions, "failed", T, true_ids,
                                    f"no token within eps={self.eps:g} at position {t} "
                                    f"(best relative distance {found[-1].distance:.3g}); "
                                    "wrong model, layer, norm setting, or not a state of a token sequence?")
            t = prefix.length
        if self.config.certify:
            self._certify(prefix, positions)
        status = "ambiguous" if any(q.duplicates or q.also_within_eps for q in positions) else "ok"
        return self._finish(t0, prefix.ids.tolist(), positions, status, T, true_ids)

    def _finish(self, t0, ids, positions, status, T, true_ids, message="") -> PromptResult:
        r = PromptResult(ids=ids, text=self.lm.decode(ids) if ids else "", status=status,
                         positions=positions, seconds=time.perf_counter() - t0, length=T, message=message,
                         true_ids=list(true_ids) if true_ids is not None else None, **self._cost)
        if true_ids is not None:
            r.exact = status != "failed" and len(ids) == len(true_ids) and _n_correct(r) == len(true_ids)
        return r

    # -- the two kinds of forward pass ---------------------------------------------------------

    def _extend(self, prefix, rows: Tensor):
        """rows [B, k] -> states [B, k, d] and grown(b, n) -> Prefix."""
        self._cost["forward_tokens"] += rows.numel()
        self._cost["tap_calls"] += 1
        return self.tap.extend(prefix, rows, keep=True)

    def _speculate(self, prefix, guess: Tensor):
        """Verify guessed ids [k] for positions t.. in one pass; accept the leading matches."""
        t = prefix.length
        h, grown = self._extend(prefix, guess[None])
        d = rel_distance(h[0], self.target[t:t + len(guess)])
        n = int((d <= self.eps).long().cumprod(0).sum())
        self._last_distance = float(d[n]) if n < len(d) else float("nan")
        if n < len(d):  # the first wrong guess was computed on a verified prefix: tell the policy
            self.policy.observe(t + n, guess[n:n + 1], h[0, n:n + 1])
        accepted = [self._position(int(v), float(dv), {}, "speculation", self.policy.lower_bounds(t + i))
                    for i, (v, dv) in enumerate(zip(guess[:n], d[:n]))]
        return grown(0, n), accepted

    def _search(self, prefix, checked: dict[int, float], continuation: Tensor | None):
        """Find the token at position t = prefix.length in the policy's order, then everything else.

        The first batch carries the guessed continuation (lookahead); returns the grown prefix, the
        new positions (last one failed if nothing passed) and the candidates already checked at the
        next unverified position.
        """
        t, V, cfg = prefix.length, self.lm.vocab_size, self.config
        seen = torch.zeros(V, dtype=torch.bool)
        for v in checked:
            seen[v] = True
        bounds = self.policy.lower_bounds(t)
        if bounds is not None:
            seen |= bounds > self.eps  # certified: these cannot pass
        queue = _Queue(self.policy.candidates(t, prefix), seen, cfg.batch_size)
        evaluated = dict(checked)
        limit = cfg.max_candidates or V
        lookahead = continuation is not None and len(continuation) > 0 and cfg.lookahead_tokens > 0
        n_batches = 0
        while len(evaluated) < limit and not self._capped():
            if lookahead:
                batch = queue.take(max(1, cfg.lookahead_tokens // (1 + len(continuation))))
            else:
                size = min(cfg.batch_size, cfg.first_batch * 4 ** n_batches)
                batch = queue.take(min(size, limit - len(evaluated)))
                n_batches += 1
            if batch is None:
                break
            rows = torch.cat([batch[:, None], continuation.expand(len(batch), -1)], 1) if lookahead else batch[:, None]
            h, grown = self._extend(prefix, rows)
            self.policy.observe(t, batch, h[:, 0])
            d = rel_distance(h, self.target[t:t + rows.shape[1]])  # [B, k]
            evaluated.update(zip(batch.tolist(), d[:, 0].tolist()))
            passing = (d[:, 0] <= self.eps).nonzero().flatten()
            if len(passing):
                b = int(passing[d[passing, 0].argmin()])
                via = "lookahead" if lookahead else "search"
                found = [self._position(int(batch[b]), float(d[b, 0]), evaluated, via, bounds, tried=len(evaluated))]
                n = 1
                if lookahead:  # the continuation of row b was computed on a verified prefix
                    ok = (d[b, 1:] <= self.eps).long().cumprod(0)
                    n += int(ok.sum())
                    found += [self._position(int(v), float(dv), {}, "lookahead")
                              for v, dv in zip(continuation[:n - 1], d[b, 1:n])]
                    nxt = {}
                    if n - 1 < len(continuation):
                        nxt = {int(continuation[n - 1]): float(d[b, n])}
                        self.policy.observe(t + n, continuation[n - 1:n], h[b, n:n + 1])
                else:
                    nxt = {}
                return grown(b, n), found, nxt
            lookahead = False
        best = min(evaluated.values(), default=float("inf"))
        if bounds is not None:  # certified lower bounds of the tokens never evaluated
            best = min(best, float(bounds.min()))
        fail = Position(token=None, distance=best, margin=None, margin_over=0, tried=len(evaluated), via="search")
        return prefix, [fail], {}

    def _certify(self, prefix, positions: list[Position]) -> None:
        """Margins for positions verified without alternatives: the policy's top `certify` others,
        evaluated on the (cropped) verified prefix."""
        k = self.config.certify
        for t, q in enumerate(positions):
            if q.margin_over >= k:
                continue
            cls = self.dups.members(q.token)
            seen = torch.zeros(self.lm.vocab_size, dtype=torch.bool)
            seen[cls] = True
            queue = _Queue(self.policy.candidates(t, prefix.crop(t)), seen, k)
            parts = []  # a policy may yield batches smaller than k
            while sum(map(len, parts)) < k and (b := queue.take(k - sum(map(len, parts)))) is not None:
                parts.append(b)
            if not parts:
                continue
            batch = torch.cat(parts)
            h = self._extend(prefix.crop(t), batch[:, None])[0][:, 0]
            d = rel_distance(h, self.target[t])
            margin = float(d.min())
            q.margin = margin if q.margin is None else min(q.margin, margin)
            q.margin_over += len(batch)
            q.tried += len(batch)
            near = [int(u) for u in batch[d <= self.eps]]
            if near:
                q.also_within_eps = sorted(set(q.also_within_eps or []) | set(near))

    def _capped(self) -> bool:
        return self.config.max_seconds is not None and time.perf_counter() - self._t0 > self.config.max_seconds

    def _position(self, v: int, dist: float, evaluated: dict[int, float], via: str, bounds: Tensor | None = None,
                  tried: int = 1) -> Position:
        """A verified position with its certificate: margin over the other candidates evaluated."""
        cls = self.dups.members(v)
        others = {u: du for u, du in evaluated.items() if u not in cls}
        margin = min(others.values()) if others else None
        over = len(others)
        if bounds is not None:  # tokens never evaluated but certified to be at least this far
            mask = torch.ones(len(bounds), dtype=torch.bool)
            mask[cls] = False
            mask[list(others)] = False
            if mask.any():
                lb = float(bounds[mask].min())
                margin = lb if margin is None else min(margin, lb)
                over += int(mask.sum())
        near = sorted(u for u, du in others.items() if du <= self.eps)
        return Position(token=v, distance=dist, margin=margin, margin_over=over, tried=tried, via=via,
                        duplicates=cls if len(cls) > 1 else None, also_within_eps=near or None)


class _Queue:
    """Candidate ids from a policy's batches, each id at most once, skipping `seen` ones."""

    def __init__(self, batches, seen: Tensor, fallback_batch: int):
        self.batches, self.seen, self.fallback_batch = batches, seen, fallback_batch
        self.buffer = torch.zeros(0, dtype=torch.long)
        self.fallback = False

    def take(self, n: int) -> Tensor | None:
        while len(self.buffer) == 0:
            batch = next(self.batches, None)
            if batch is None:  # the policy ran out: the rest of the vocabulary, in id order
                rest = (~self.seen).nonzero().flatten()
                if len(rest) == 0:
                    return None
                batch, self.fallback = rest, True
            batch = torch.as_tensor(batch, dtype=torch.long).flatten()
            batch = batch[~self.seen[batch]]
            self.buffer = batch[torch.tensor(_first_occurrence(batch), dtype=torch.long)]
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        self.seen[out] = True
        return out


def _first_occurrence(batch: Tensor) -> list[int]:
    """Indices of the first occurrence of each distinct id, in order."""
    seen, idx = set(), []
    for i, v in enumerate(batch.tolist()):
        if v not in seen:
            seen.add(v)
            idx.append(i)
    return idx


# ----------------------------------------------------------------------------------------------

_DUPS: dict = {}


def duplicate_classes(lm: LM) -> DuplicateClasses:
    """Duplicate-row classes of lm's embeddings, cached while the weights are unchanged."""
    w = lm.embed.weight
    key = (id(w), w._version, tuple(w.shape))
    if key not in _DUPS:
        _DUPS.clear()
        _DUPS[key] = DuplicateClasses(lm.embedding_rows())
    return _DUPS[key]


def as_prompts(states, d_model: int) -> list[Tensor]:
    """[T, d], [B, T, d] or a list of [T_i, d] -> list of [T_i, d]; raises InversionError."""
    if isinstance(states, (list, tuple)):
        prompts = [torch.as_tensor(s) for s in states]
    else:
        states = torch.as_tensor(states)
        if states.dim() == 2:
            prompts = [states]
        elif states.dim() == 3:
            prompts = list(states)
        else:
            raise InversionError(f"states must be [T, d] or [B, T, d], got shape {tuple(states.shape)}")
    if not prompts:
        raise InversionError("no prompts to invert (empty input)")
    for i, s in enumerate(prompts):
        if s.dim() != 2:
            raise InversionError(f"prompt {i}: states must be [T, d], got shape {tuple(s.shape)}")
        if s.shape[1] != d_model:
            raise InversionError(f"prompt {i}: hidden size {s.shape[1]} does not match the model's "
                                 f"d_model={d_model} (wrong model?)")
        if s.shape[0] == 0:
            raise InversionError(f"prompt {i}: no positions (empty input)")
        if not s.is_floating_point():
            raise InversionError(f"prompt {i}: states must be floating point, got {s.dtype}")
    return prompts


def invert(lm: LM | str, states, layer: int, config: InvertConfig | None = None, final_norm: bool = False,
           progress: bool = True, true_ids=None, tap=None) -> InversionResult:
    """Recover the token ids whose states at `layer` are `states`.

    states: [T, d], [B, T, d] or a list of [T_i, d] (float32/16/bf16), as captured by LayerTap.states
    (or HF hidden_states[layer]; `final_norm=True` for post-final-norm states). true_ids (optional,
    list of id lists) only adds exact-match accounting. Raises InversionError for input that cannot
    be inverted at all; per-prompt failures are reported in the result, never as wrong tokens.
    tap: a surface (models/surfaces.py); states are then its observations [T, tap.dim].
    """
    from tqdm.auto import tqdm

    config = config or InvertConfig()
    lm = load_model(lm) if isinstance(lm, str) else lm
    layer, final_norm = (tap.layer, tap.final_norm) if tap is not None else (lm.layer_index(layer), final_norm)
    prompts = as_prompts(states, tap.dim if tap is not None else lm.d_model)
    dtypes = {s.dtype for s in prompts}
    eps = config.eps if config.eps is not None else max(tolerance(dt) for dt in dtypes)
    if true_ids is not None and len(true_ids) != len(prompts):
        raise InversionError(f"{len(true_ids)} ground-truth sequences for {len(prompts)} prompts")
    engine = SipIt(lm, layer, config, final_norm=final_norm, eps=eps, tap=tap)
    result = InversionResult(model=lm.name, layer=layer, final_norm=final_norm, policy=engine.policy.name, eps=eps,
                             calibration_seconds=engine.calibration_seconds, vocab_size=lm.vocab_size)
    t0 = time.perf_counter()
    bar = tqdm(prompts, desc=f"sipit {engine.policy.name} L{layer}", unit="prompt", disable=not progress)
    for i, s in enumerate(bar):
        r = engine.invert_prompt(s, true_ids[i] if true_ids is not None else None)
        result.prompts.append(r)
        bar.set_postfix(failed=sum(p.status == "failed" for p in result.prompts))
    result.seconds = time.perf_counter() - t0
    return result


__all__ = ["InversionError", "InversionResult", "InvertConfig", "ModelError", "Position", "PromptResult", "SipIt",
           "invert"]
