"""What an inversion returns: per position, per prompt, per run. Distances are relative (verify.py).

Statuses say what was shown, never more:
- a position is *verified* when its token's recomputed state is within ε (`distance` ≤ ε), and
  *certified* when moreover every other token outside its duplicate class is shown to be > ε away
  (`certified_by`: "evaluated" through the tap, "bound" by a sound lower bound, or "evaluated+bound");
- a prompt is "ok" only if every position is verified and no known other token is within ε; a
  duplicate class or any other token known within ε makes it "ambiguous" (listed per position);
  "failed" when a position has no token within ε.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class Position:
    """One recovered (or failed) position."""

    token: int | None  # accepted id; None if nothing within ε
    distance: float  # of the accepted token (or, if failed, the best candidate evaluated)
    margin: float | None  # smallest distance (evaluated or lower bound) of the other tokens covered
    margin_over: int  # how many other tokens (outside the token's class) the margin covers
    tried: int  # candidates evaluated by a forward pass at this position (the model's, or the draft's: drafted)
    via: str  # "speculation" | "lookahead" | "search" | "full-length" (a search's candidate within ε only through a
    #           full forward of the prompt's length: sipit.NEAR) | "hardprompts"
    certified: bool = False  # margin covers every other token and margin > ε
    certified_by: str | None = None  # "evaluated" | "bound" | "evaluated+bound"
    duplicates: list[int] | None = None  # the token's class of identical embedding rows, if > 1
    also_within_eps: list[int] | None = None  # other (non-duplicate) tokens within ε: a near-collision
    drafted: int = 0  # of `tried`, those only a bfloat16 draft of the model evaluated, far from the observation


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
    pass_seconds: float = 0.0  # of `seconds`, the loop's forward passes (its share of each lock-step pass);
    #                            the rest: the policy's ranking, certificates, the loop itself
    length: int = 0  # T, number of observed positions
    message: str = ""
    true_ids: list[int] | None = None
    exact: bool | None = None  # every position recovered and equal to true_ids up to duplicates
    left_padding: int = 0  # leading positions of the file's row skipped as left padding: the rest's states were found
    #                        to be its tokens' alone, so nothing there attended to them (no mask given; invert/cli.py)
    right_padding: int = 0  # positions of the row after the prompt found to be a batch's right padding: each one's
    #                         state that of a pad attending to the prompt only (no mask given; SipIt._right_padding)

    @property
    def forward_equivalents(self) -> float:
        """Cost in full forward passes of the prompt: (forward + 2 × backward tokens) / T."""
        return (self.forward_tokens + 2 * self.backward_tokens) / max(self.length, 1)

    def check(self) -> "PromptResult":
        """Set `exact` from true_ids (if known)."""
        if self.true_ids is not None:
            self.exact = (self.status != "failed" and len(self.ids) == len(self.true_ids)
                          and n_correct(self) == len(self.true_ids))
        return self

    def to_json(self) -> dict:
        d = asdict(self)
        d["forward_equivalents"] = round(self.forward_equivalents, 3)
        return d


@dataclass
class HardPromptsResult(PromptResult):
    loss_curve: list[float] = field(default_factory=list)  # the optimisation's loss at every step


def judge(positions: list[Position], eps: float, failure: str = "") -> tuple[str, str]:
    """(status, message) of a prompt: "failed" with `failure` if given; else "ambiguous" (saying
    where) if any position has a duplicate class, a known other token within ε or a margin ≤ ε
    (a lower bound that could not exclude a token); else "ok"."""
    if failure:
        return "failed", failure
    near = {t: q.also_within_eps for t, q in enumerate(positions) if q.also_within_eps}
    dups = [t for t, q in enumerate(positions) if q.duplicates]
    open_ = [t for t, q in enumerate(positions) if q.margin is not None and q.margin <= eps and not q.also_within_eps]
    why = ([f"other tokens within eps at positions {near}"] if near else []) + \
          ([f"duplicate-token classes at positions {dups}"] if dups else []) + \
          ([f"tokens not excluded (margin <= eps) at positions {open_}"] if open_ else [])
    return ("ambiguous", "; ".join(why)) if why else ("ok", "")


def n_correct(p: PromptResult) -> int:
    n = 0
    for q, true in zip(p.positions, p.true_ids):
        n += q.token is not None and (q.token == true or true in (q.duplicates or []))
    return n


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
    tolerance: dict | None = None  # eps.Tolerance.to_json(): measured noise, factor, dtype rounding
    certify: str = "none"
    tap: str = ""  # what was observed (tap.key)

    @property
    def ok(self) -> bool:
        return all(p.status != "failed" for p in self.prompts)

    def summary(self) -> dict:
        P = self.prompts
        positions = [q for p in P for q in p.positions]
        accepted = [q for q in positions if q.token is not None]
        n_pos = sum(p.length for p in P)
        known = [p for p in P if p.true_ids is not None]
        correct = sum(n_correct(p) for p in known)
        secs = sorted(p.seconds for p in P)
        tried = [q.tried for q in positions]
        worst = max((q.distance for q in accepted), default=None)
        return dict(
            model=self.model, layer=self.layer, tap=self.tap, final_norm=self.final_norm, policy=self.policy,
            eps=self.eps, tolerance=self.tolerance, certify=self.certify, prompts=len(P), positions=n_pos,
            ok=sum(p.status == "ok" for p in P), ambiguous=sum(p.status == "ambiguous" for p in P),
            failed=sum(p.status == "failed" for p in P),
            recovered_positions=len(accepted),
            certified_positions_pct=round(100 * sum(q.certified for q in accepted) / max(n_pos, 1), 2),
            max_accepted_distance=worst,
            eps_headroom=round(self.eps / worst, 2) if worst else None,  # ε ÷ largest accepted distance
            token_accuracy=correct / max(sum(p.length for p in known), 1) if known else None,
            exact_match_rate=sum(bool(p.exact) for p in known) / len(known) if known else None,
            seconds_total=round(self.seconds, 3),
            seconds_per_prompt_median=round(secs[len(secs) // 2], 4) if secs else None,
            seconds_per_prompt_mean=round(sum(secs) / len(secs), 4) if secs else None,
            calibration_seconds=round(self.calibration_seconds, 2),
            candidates_per_position=round(sum(tried) / max(len(tried), 1), 3),
            drafted_per_position=round(sum(q.drafted for q in positions) / max(len(tried), 1), 3),
            vocab_explored_pct=round(100 * sum(tried) / max(len(tried), 1) / max(self.vocab_size, 1), 5),
            forward_equivalents_per_prompt=round(sum(p.forward_equivalents for p in P) / max(len(P), 1), 3),
            tap_calls_per_prompt=round(sum(p.tap_calls for p in P) / max(len(P), 1), 3),
            speculated_positions_pct=round(
                100 * sum(q.via in ("speculation", "lookahead") for q in positions) / max(len(positions), 1), 2),
        )

    def to_jsonl(self) -> str:
        return "".join(json.dumps(p.to_json()) + "\n" for p in self.prompts)
