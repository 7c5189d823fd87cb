"""Which model, layer and norm made a states file: `sipit identify`.

Leaked or exported hidden states often come without their provenance: nnsight's saved outputs, a
raw .pt or .npy dump, vLLM's export (its layer ids are not stored). Position 0's state depends on
its token alone, so a hypothesis (model, layer ℓ, final norm or not) is confirmed when some token's
one-token state at ℓ equals an observed first position up to the file's rounding.

    ident = identify(lm, first)          # first [B, d]: the observed position-0 states
    ident.best                           # Hypothesis(layer, final_norm, matched, distances, tokens) or None
    identify(lm, other, screens=Screens.fit(lm))  # the screens fitted once for many files

Distances are *scaled*: each coordinate's difference over that coordinate's magnitude plus the
median magnitude, RMS over coordinates (scaled_distance). The plain relative distance cannot
tell layers apart where a few massive activations hold the norm: SmolLM2's position 0 at layers
12-27 moves 0.07-0.14% of its norm per block, less than bfloat16's rounding, but 0.6-1.4% in the
scaled distance, against 0.08% for a bfloat16-stored state and ≤ 4e-6 for float32 recomputation
(docs/results/identify/README.md).

Finding the token without running all V tokens through every layer: two ridge maps per hypothesis
(Screens: state -> embedding row, and embedding row -> state), fitted on PROBE tokens (specials,
frequent text tokens, random ids) run once through every layer, shortlist TOP tokens each per
observed prompt; the shortlists go through every layer in one more pass, and every hypothesis is
scored on all of them. Where nothing matches, the shortlists widen once (×8); with `exhaustive`,
then every token goes through every block (SmolLM2: 145 s on this project's 2-core CPU). Where
the file carries its prompts' ids, one forward pass of them decides (identify_with_ids).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from math import inf

import torch
from torch import Tensor

from .invert.learned.ranker import top_rows
from .models import LM, run_layers

RECOMPUTE = 1e-4  # scaled distance allowed for recomputation in float32 (measured ≤ 4e-6 on SmolLM2, any layer)
PROBE = 4096  # tokens the ridge maps are fitted on: the specials, frequent text tokens (half), random ids
TOP = 8  # shortlisted tokens per prompt and hypothesis, widened ×8 once where nothing matches
PROMPTS = 4  # observed first positions used (more only cost passes)
FORWARD_RANK = 16  # directions of the forward map's quadratic term (64 shortlisted as well on the tuning seed)
RIDGE = 1e-4  # ridge penalty per probe token, on standardised states (1e-2 shortlisted half as many true tokens)


def scaled_distance(x: Tensor, ref: Tensor) -> Tensor:
    """RMS over the last dim of (x − ref) / (|ref| + median |ref|), in float64: a relative distance per
    coordinate, so that a few massive coordinates do not hide the others. x [..., d], ref [..., d]
    broadcast -> [...]. A storage format with elementwise relative rounding u keeps it ≤ u."""
    x, ref = x.double(), ref.double()
    scale = ref.abs() + ref.abs().median(-1, keepdim=True).values
    return ((x - ref) / scale.clamp_min(1e-30)).square().mean(-1).sqrt()


@dataclass
class Hypothesis:
    """One (layer, final_norm) of a model scored against the observed first positions."""
    layer: int
    final_norm: bool
    matched: int  # observed prompts whose first position some token's state matches within tolerance
    distances: list[float]  # per prompt, the smallest scaled distance of a candidate (by ids: over all positions)
    tokens: list[int]  # per prompt, the token of that smallest distance

    @property
    def distance(self) -> float:
        """The median of the prompts' distances (the lower middle of an even count): what hypotheses are sorted by."""
        return sorted(self.distances)[(len(self.distances) - 1) // 2]

    @property
    def name(self) -> str:
        return f"layer {self.layer}" + (" with the final norm" if self.final_norm else "")


@dataclass
class Identification:
    """Every hypothesis of one model, best first; `best` is None unless exactly one matches best."""
    model: str
    hypotheses: list[Hypothesis]
    tolerance: float  # the scaled distance within which a first position matches
    prompts: int  # observed prompts used
    shortlist: int  # tokens per prompt and hypothesis in the last round
    seconds: float
    by_ids: bool = False  # decided from the file's own ids (all positions), not position 0
    exhaustive: bool = False  # every token was checked (no shortlist had matched)

    @property
    def matching(self) -> list[Hypothesis]:
        top = self.hypotheses[0].matched
        return [h for h in self.hypotheses if h.matched == top] if top else []

    @property
    def best(self) -> Hypothesis | None:
        return self.matching[0] if len(self.matching) == 1 else None

    def to_json(self) -> dict:
        best = self.best
        return dict(model=self.model, identified=best is not None,
                    layer=best.layer if best else None, final_norm=best.final_norm if best else None,
                    matching=[h.name for h in self.matching], tolerance=self.tolerance, prompts=self.prompts,
                    shortlist=self.shortlist, by_ids=self.by_ids, exhaustive=self.exhaustive,
                    seconds=round(self.seconds, 3), hypotheses=[vars(h) for h in self.hypotheses])


def tolerance(first: Tensor, lm: LM, storage_error: float | None = None) -> float:
    """The scaled distance a matching first position may have: recomputation (RECOMPUTE in float32; 4 units of
    rounding of a lower compute precision), the observations' own float rounding (their dtype's unit), and a
    storage format's normwise relative error translated to the scaled distance (‖x‖/(√d · median|x|) times it:
    large where massive activations set the norm). first [B, d] as stored."""
    from .invert.verify import UNIT_ROUNDOFF

    tol = max(RECOMPUTE, 4 * UNIT_ROUNDOFF.get(lm.dtype, 2.0 ** -8))
    tol += UNIT_ROUNDOFF.get(first.dtype, 0.0) if first.dtype != torch.float32 else 0.0
    if storage_error:
        x = first.double()
        ratio = x.norm(dim=-1) / (x.shape[-1] ** 0.5 * x.abs().median(-1).values.clamp_min(1e-30))
        tol += storage_error * float(ratio.max())
    return tol


def probe_tokens(lm: LM, n: int, seed: int = 0) -> Tensor:
    """n distinct token ids to fit the screens on: the specials, the most frequent tokens of the `tech` corpus
    (half of n: prompts start with frequent tokens, and a map fitted on random ids alone shortlisted about half of
    real first tokens at SmolLM2's deeper layers), then random ids. [n]"""
    from collections import Counter

    from .corpora import sample

    frequent = []
    if lm.tokenizer is not None:
        counts = Counter(i for p in sample("tech:400", lm.tokenizer, 32, seed=0) for i in p.ids)
        frequent = [t for t, _ in counts.most_common(n // 2) if t < lm.vocab_size]
    gen = torch.Generator().manual_seed(seed)
    ids = lm.special_ids().tolist() + frequent + torch.randperm(lm.vocab_size, generator=gen).tolist()
    specials = len(lm.special_ids())
    return torch.tensor(list(dict.fromkeys(ids))[:max(n, specials)])  # each id once, in this order


@torch.no_grad()
def states_at_every_layer(lm: LM, tokens: Tensor, dtype: torch.dtype = torch.float32,
                          batch: int = 1024) -> list[Tensor]:
    """Each token's one-token state at every layer 0..L: 2(L+1) tensors [n, d] on the CPU in `dtype`, raw then
    normed per layer (index 2ℓ raw, 2ℓ+1 after the final norm)."""
    layers = list(range(lm.n_layers + 1))
    parts = []
    for i in range(0, len(tokens), batch):
        states = run_layers(lm, layers, ids=tokens[i:i + batch, None].to(lm.device))
        parts.append([s.to("cpu", dtype) for h in states for s in (h[:, 0], lm.norm(h)[:, 0])])
    return [torch.cat([p[j] for p in parts]) for j in range(len(parts[0]))]


@dataclass
class Screens:
    """Per hypothesis (2ℓ: layer ℓ raw, 2ℓ+1: after the final norm), two ridge maps fitted on probe tokens'
    one-token states, each shortlisting the tokens an observed first position may hold:
    - backward: standardised state -> embedding row; the tokens whose rows are nearest the guess;
    - forward: embedding row -> standardised state; the tokens whose predicted states are nearest the observed
      one, 2 q·ê_v − ‖ê_v A‖² with q = A x̂ (ê_v: standardised row), the quadratic term in A Aᵀ's top
      FORWARD_RANK directions.
    On a tuning seed (100 first tokens of prose, code, chat and random ids) the backward map held the truth in its
    top 8 for 84-100% at SmolLM2's layers and 56-100% at Gemma-3-270M's, the forward one 32-100% and 88-100%: they
    fail on different models, so both are used. Fitted once per model (one pass of `probe` tokens through every
    block)."""
    maps: list[tuple[Tensor, ...]]  # (state mean [d], state scale [d], backward [d, e], forward [d, e], ‖ê_v A‖² [V])
    rows: Tensor  # the embedding rows [V, e]
    row_mean: Tensor  # [e]
    row_scale: Tensor  # [e]
    specials: Tensor  # always shortlisted
    seconds: float

    @classmethod
    @torch.no_grad()
    def fit(cls, lm: LM, probe: int = PROBE, seed: int = 0) -> "Screens":
        start = time.perf_counter()
        tokens = probe_tokens(lm, probe, seed)
        E = lm.embedding_rows().float().cpu()  # [V, e]
        my = E[tokens].mean(0)
        sy = (E[tokens] - my).square().mean(0).sqrt().clamp_min(1e-12)
        Ys = (E[tokens] - my) / sy  # [n, e] standardised probe rows
        rows_factor = torch.linalg.cholesky(Ys.T @ Ys + RIDGE * len(Ys) * torch.eye(Ys.shape[1]))
        maps = []
        for X in states_at_every_layer(lm, tokens, torch.bfloat16):  # bfloat16: 2(L+1) probe tables stay small
            X = X.float()
            mx = X.mean(0)
            sd = (X - mx).square().mean(0).sqrt().clamp_min(1e-12)
            Xs = (X - mx) / sd
            back = torch.linalg.solve(Xs.T @ Xs + RIDGE * len(X) * torch.eye(X.shape[1]), Xs.T @ Ys)  # [d, e]
            A = torch.cholesky_solve(Ys.T @ Xs, rows_factor)  # [e, d]: ê A ≈ x̂
            values, vectors = torch.linalg.eigh(A @ A.T)
            U = vectors[:, -FORWARD_RANK:] * values[-FORWARD_RANK:].clamp_min(0).sqrt()  # A Aᵀ ≈ U Uᵀ
            U = U / sy[:, None]  # ê_v U = E_v U' − my U' with U' = U / sy: no standardised copy of E
            quad = (E @ U - my @ U).square_().sum(1)  # [V]
            maps.append((mx, sd, back.bfloat16(), A.T.contiguous().bfloat16(), quad))  # (8B: 66 × 2 × 4096², 4.4 GB)
        return cls(maps, E, my, sy, lm.special_ids(), time.perf_counter() - start)

    def shortlists(self, x: Tensor, m: int) -> Tensor:
        """For each x [B, d], each hypothesis' m best tokens by the backward map (rows nearest its guess), then its
        m best by the forward map (predicted states nearest x; some may repeat). [H, B, 2m]"""
        m = min(m, len(self.rows))
        xs = [(x.float() - mx) / sd for mx, sd, *_ in self.maps]  # per hypothesis, standardised [B, d]
        guess = torch.cat([x_ @ back.float() for x_, (_, _, back, _, _) in zip(xs, self.maps)])  # [H·B, e]
        guess = guess * self.row_scale + self.row_mean  # an embedding row
        near = top_rows(guess @ self.rows.T - self.rows.square().sum(1) / 2, m)
        q = torch.cat([x_ @ fwd.float() for x_, (_, _, _, fwd, _) in zip(xs, self.maps)]) / self.row_scale
        quad = torch.stack([quad for *_, quad in self.maps]).repeat_interleave(len(x), 0)  # [H·B, V]
        ahead = top_rows(2 * (q @ self.rows.T - (q @ self.row_mean)[:, None]) - quad, m)
        return torch.cat([near, ahead], 1).view(len(self.maps), len(x), 2 * m)


@torch.no_grad()
def identify(lm: LM, first: Tensor, storage_error: float | None = None, *, screens: Screens | None = None,
             top: int = TOP, exhaustive: bool = False) -> Identification:
    """Score every (layer, final_norm) of `lm` against observed first positions first [B, d] (the first PROMPTS
    are used; screens: Screens.fit(lm), fitted here if not given; exhaustive: where no shortlist matches, every
    token at every hypothesis). -> Identification, hypotheses best first (most prompts matched, then
    smallest distance)."""
    start = time.perf_counter()
    screens = screens or Screens.fit(lm)
    x = first[:PROMPTS].double().cpu()
    tol = tolerance(first[:PROMPTS], lm, storage_error)
    for m in (top, 8 * top):  # where nothing matched: once more with every shortlist 8 times as long
        tokens = torch.cat([screens.specials, screens.shortlists(x, m).flatten()]).unique()
        nearest = [_nearest(x, s, tokens) for s in states_at_every_layer(lm, tokens)]
        if any((d <= tol).any() for d, _ in nearest):
            break
    swept = exhaustive and not any((d <= tol).any() for d, _ in nearest)
    if swept:  # every token at every hypothesis, a block of the vocabulary at a time
        from tqdm import tqdm

        for i in tqdm(range(0, lm.vocab_size, 1024), desc="identify: every token", leave=False, disable=None):
            block = torch.arange(i, min(i + 1024, lm.vocab_size))
            for h, s in enumerate(states_at_every_layer(lm, block)):
                d, t = _nearest(x, s, block)
                closer = d < nearest[h][0]
                nearest[h] = (torch.where(closer, d, nearest[h][0]), torch.where(closer, t, nearest[h][1]))
        m = lm.vocab_size
    hypotheses = [Hypothesis(h // 2, bool(h % 2), int((d <= tol).sum()), d.tolist(), t.tolist())
                  for h, (d, t) in enumerate(nearest)]
    hypotheses.sort(key=lambda h: (-h.matched, h.distance))
    return Identification(lm.name, hypotheses, tol, len(x), m, time.perf_counter() - start, exhaustive=swept)


def _nearest(x: Tensor, states: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Each observed first position x [B, d] against candidates' states [n, d] at one hypothesis: the smallest
    scaled distance [B] float64 and its token [B]; inf where the hypothesis' states are not as wide as x (a final
    norm that projects: OPT-350m's project_out)."""
    if states.shape[-1] != x.shape[-1]:
        return torch.full((len(x),), inf, dtype=torch.float64), tokens[:1].expand(len(x))
    d = torch.stack([scaled_distance(xb[None], states) for xb in x])  # [B, n]
    i = d.argmin(1)
    return d.gather(1, i[:, None])[:, 0], tokens[i]


@torch.no_grad()
def identify_with_ids(lm: LM, ids: list[int], states: Tensor, storage_error: float | None = None) -> Identification:
    """With the prompt's own ids [T] known (a vLLM export, a sipit capture; capture.check_layer): every (layer,
    final_norm) scored by the largest scaled distance over all T positions of states [T, d], from one forward
    pass."""
    start = time.perf_counter()
    tol = tolerance(states, lm, storage_error)
    x = torch.tensor([ids], device=lm.device)
    hypotheses = []
    for layer, h in enumerate(run_layers(lm, list(range(lm.n_layers + 1)), ids=x)):
        for final_norm, y in ((False, h[0]), (True, lm.norm(h)[0])):
            d = float(scaled_distance(states.to(y.device), y).max()) if y.shape[-1] == states.shape[-1] else inf
            hypotheses.append(Hypothesis(layer, final_norm, int(d <= tol), [d], list(ids[:1])))
    hypotheses.sort(key=lambda h: (-h.matched, h.distance))
    return Identification(lm.name, hypotheses, tol, 1, 0, time.perf_counter() - start, by_ids=True)


def identify_states(lm: LM, st, screens: Screens | None = None, exhaustive: bool = False) -> Identification:
    """A loaded states file (states.States) against every (layer, final_norm) of `lm`: from its own ids where it
    has them (the first prompt), else from its prompts' first positions (of a batch without a mask, the first after
    what looks like left padding: the first token after padding attends to itself alone, as at position 0)."""
    if st.ids:
        return identify_with_ids(lm, st.ids[0], st.prompts[0], st.error)
    first = torch.stack([p[k] for p, k in zip(st.prompts, st.padding_runs())])
    return identify(lm, first, st.error, screens=screens, exhaustive=exhaustive)
