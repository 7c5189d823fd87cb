"""What makes a recovered token certain: ε-acceptance, certificates, duplicate and near-duplicate tokens.

A candidate token v is *accepted* (verified) at position t when the state it produces on the
verified prefix, recomputed through the tap, is within ε of the observed state, relatively:

    ‖h_t(π ⊕ v) − ĥ_t‖ / ‖ĥ_t‖ ≤ ε.

ε is relative because state norms vary by orders of magnitude across positions, layers and models
(position 0 of Llama-type models carries "massive activations"). It is *measured* (eps.py): the
recomputation noise of the tap (KV cache vs one full forward, batched vs single) times a stated
factor, plus the rounding of the observed states' dtype (`tolerance`).

A verified position is *certified* when every other token (outside the accepted token's class of
bit-identical embedding rows) is shown to be farther than ε: by evaluation through the tap, or by a
sound lower bound (the learned policy's position-0 table). Tokens whose embedding rows are almost
identical (`near_neighbours`) are the likeliest to collide, so the loop always evaluates them.
Tokens with bit-identical rows produce identical states everywhere: a class no method can split.
"""
from __future__ import annotations

import json

import torch
from torch import Tensor

from ..io import write_json
from ..models.load import cache_dir

UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8,
                 torch.float64: 2.0 ** -53}
NEAR_REL = 1e-2  # embedding rows closer than this (relative) are near-duplicates, checked at every position
NEAR_MAX = 64  # near-duplicates kept per token (the closest)
PRUNE_ABOVE = 64  # survivors of near_neighbours' projection a row (over a block) above which _close_rows prunes them


def tolerance(dtype: torch.dtype, eps0: float) -> float:
    """ε for states stored in `dtype` when recomputation is within ε₀ (relative) of the exact state:
    rounding x to x̃ moves it by ‖x̃ − x‖ ≤ u‖x‖, so a recomputation within ε₀ of x is within
    (ε₀ + u)/(1 − u) of x̃."""
    u = UNIT_ROUNDOFF.get(dtype, 2.0 ** -8)
    return (eps0 + u) / (1 - u)


def rel_distance(h: Tensor, target: Tensor) -> Tensor:
    """Relative distance ‖h − target‖ / ‖target‖ over the last dim, in float64.

    h [..., d] and target [..., d] broadcast (e.g. h [B, d] vs target [d] -> [B];
    h [B, k, d] vs target [k, d] -> [B, k]).
    """
    h, target = h.double(), target.double()
    return (h - target).norm(dim=-1) / target.norm(dim=-1).clamp_min(1e-30)


class DuplicateClasses:
    """Tokens whose embedding rows (as block 0 sees them) are bit-identical.

    `rep[v]` is the smallest id of v's class; `members(v)` lists the class (just [v] if unique);
    `size[rep[v]]` counts it.
    """

    def __init__(self, embeddings: Tensor):
        """embeddings [V, d]"""
        V = embeddings.shape[0]
        bits = embeddings.detach().float().cpu().contiguous().view(torch.int32)  # exact equality = equal bits
        weights = torch.randint(1, 2 ** 61, (bits.shape[1],), generator=torch.Generator().manual_seed(0)) | 1
        key = torch.cat([(chunk.long() * weights).sum(1) for chunk in bits.split(8192)])  # wraps mod 2^64
        self.rep = torch.arange(V)
        order = torch.argsort(key, stable=True)
        sorted_key = key[order]
        same = torch.nonzero(sorted_key[1:] == sorted_key[:-1]).flatten()
        for i in same.tolist():  # hash ties: confirm bit equality, then union with the earlier row
            a, b = order[i].item(), order[i + 1].item()
            if torch.equal(bits[a], bits[b]):
                ra, rb = self.rep[a].item(), self.rep[b].item()
                r = min(ra, rb)
                self.rep[self.rep == ra] = r
                self.rep[self.rep == rb] = r
        self.size = torch.bincount(self.rep, minlength=V)  # [V]: the class sizes, at their representatives
        self.classes: dict[int, list[int]] = {}
        for v in torch.nonzero(self.rep != torch.arange(V)).flatten().tolist():
            self.classes.setdefault(self.rep[v].item(), [self.rep[v].item()]).append(v)

    def members(self, v: int) -> list[int]:
        return self.classes.get(int(self.rep[v]), [int(v)])

    @property
    def n_duplicates(self) -> int:
        """Number of ids that share their embedding row with another id."""
        return sum(len(c) for c in self.classes.values())

    def __repr__(self):
        return f"DuplicateClasses({len(self.classes)} classes, {self.n_duplicates} ids)"


def near_neighbours(embeddings: Tensor, dups: DuplicateClasses, rel: float = NEAR_REL,
                    k_max: int = NEAR_MAX) -> dict[int, list[int]]:
    """token -> the other tokens (outside its duplicate class) whose embedding row is within
    rel·‖row‖, closest first, at most k_max. Empty for almost every token of a trained model.

    Sound screen: project the (centred) rows onto their principal axes (an orthogonal projection
    never increases a distance); cut into strips of the second coordinate as wide as the largest radius
    and sorted by the first within each, a row's partners lie in its strip or the two next to it, within
    ±radius of its first coordinate, so each block of rows is compared only with those three windows, in
    float64; survivors are checked exactly. Where many survive the projection (Gemma-3's rows all have one
    norm: 2·10⁷ pairs, whose exact check made this 253 s of its first inversion), a float32 product over every
    dimension prunes them first (_close_rows: 77.7 s, the same lists). The first coordinate alone left
    Gemma-3's rows windows of 12,000 rows; the strips, 5.5× fewer pairs: 12-37 s (75-79 before), Qwen2.5-1.5B
    14-18 s (20-24), SmolLM2 1.7-2.0 s either way, the same lists; its float64 rows made in chunks: Gemma-3 +1.0-3.7
    GiB of peak memory where it was +6.3-13.8, Qwen 1.7 (2.5), for ~2 s more on Qwen
    (docs/results/invert/near_neighbours_ab.py). embeddings [V, d]; ~V × (mean window) work.
    """
    # one row per duplicate class: Gemma-3 has classes of thousands of identical rows, whose pairs
    # (all inside one class, never near-duplicates) would otherwise fill the screen (100+ GB)
    reps = dups.rep.unique()  # [R] token ids
    X = embeddings.detach().cpu()  # [V, d] as given
    # float64 rows are made 16,384 at a time, and whole only once, in the screen's order (a whole copy at each step,
    # 1.3 GB each for Gemma-3, grew the process's peak by 15 GB)
    mean = sum(X[c].double().sum(0) for c in reps.split(1 << 14)) / len(reps)  # [d] (distances unchanged)
    sample = X[reps[:: max(1, len(reps) // 4096)]].double() - mean
    basis = torch.linalg.svd(sample, full_matrices=False)[2][:32].T  # [d, k] orthonormal
    radius, P = [], []
    for c in reps.split(1 << 14):
        x = X[c].double()
        radius.append(rel * x.norm(dim=1))  # relative to each token's own row
        P.append((x - mean) @ basis)
    radius, P = torch.cat(radius), torch.cat(P)  # [R], [R, k]
    rs = radius * (1 + 1e-9)  # (the projection's rounding)
    width = float(rs.max()) or 1.0  # (all rows zero: one class, one row)
    strip = (P[:, 1] / width).floor().long() if P.shape[1] > 1 else torch.zeros(len(P), dtype=torch.long)
    order = P[:, 0].argsort()
    order = order[strip[order].argsort(stable=True)]  # by strip, then by the first coordinate
    P, radius, rs, reps, strip = P[order], radius[order], rs[order], reps[order], strip[order]  # (from here on)
    E = X[reps].double().sub_(mean)  # [R, d]
    first = P[:, 0].contiguous()
    values, counts = strip.unique_consecutive(return_counts=True)
    ends = counts.cumsum(0).tolist()
    segment = {s: (e - n, e) for s, n, e in zip(values.tolist(), counts.tolist(), ends)}  # strip -> its rows
    close, pairs = None, []
    for s, (s0, s1) in segment.items():
        for start in range(s0, s1, 512):
            rows = slice(start, min(start + 512, s1))
            for t0, t1 in (segment[t] for t in (s - 1, s, s + 1) if t in segment):
                a0 = t0 + int(torch.searchsorted(first[t0:t1], first[rows] - rs[rows]).min())
                b0 = t0 + int(torch.searchsorted(first[t0:t1], first[rows] + rs[rows], right=True).max())
                if a0 >= b0:
                    continue
                kept = torch.cdist(P[rows], P[a0:b0]) <= rs[rows, None]  # [n, W]
                if kept.sum() > PRUNE_ABOVE * kept.shape[0]:
                    close = close or _close_rows(E, rs)
                    kept &= close(rows, a0, b0)
                i, j = kept.nonzero().unbind(1)
                a, b = start + i, a0 + j
                a, b = a[a != b], b[a != b]  # (every row is kept with itself)
                for c in range(0, len(a), 1024):  # exact check of the survivors (in small chunks: a fresh buffer of
                    ac, bc = a[c:c + 1024], b[c:c + 1024]  # 64k rows, page faults and all, took 3.5x as long)
                    dist = (E[ac] - E[bc]).norm(dim=1)
                    near = dist <= radius[ac]
                    pairs.append((ac[near], bc[near], dist[near]))
    if not pairs:
        return {}
    a, b, dist = (torch.cat(x) for x in zip(*pairs))
    out: dict[int, list] = {}
    for u, v, dv in zip(reps[a].tolist(), reps[b].tolist(), dist.tolist()):
        out.setdefault(u, []).append((dv, v))
    out = {u: [v for _, v in sorted(vs)[:k_max]] for u, vs in out.items()}
    for u, r in enumerate(dups.rep.tolist()):  # a class's other members share its representative's list
        if u != r and r in out:
            out[u] = out[r]
    return out


def _close_rows(rows: Tensor, radius: Tensor):
    """rows [R, d] float64 and their radii [R] -> close(block, a0, b0): [n, b0 − a0] bool, True wherever
    ‖rows[i] − rows[j]‖ ≤ radius[i] may hold (i in the slice `block`, j in a0..b0 − 1), from one float32 product
    ‖x‖² + ‖y‖² − 2x·y, sound: with u the float32 rounding, rows within the radius are within r_x + u(‖x‖ + ‖y‖) once
    rounded, so their squared distance is at most 2(r_x + u‖x‖)² + 2u²‖y‖², computed to within c(‖x‖² + ‖y‖²),
    c = 2γ_{d+4} (γ_n = nu/(1 − nu): the product's accumulated rounding, ≤ γ_d‖x‖‖y‖ twice, the few roundings around
    it and the norms', with room to spare); split into a term per column, in the product, and one per row."""
    low, norm = rows.float(), rows.norm(dim=1)  # [R, d] float32, [R] float64
    sq = torch.cat([c.double().square().sum(1) for c in low.split(1 << 14)])  # [R]: of the float32 rows
    u = UNIT_ROUNDOFF[torch.float32]
    n = (rows.shape[1] + 4) * u
    c = 2 * n / (1 - n)
    column = (sq - (2 * u * u + c) * norm.square()).float()  # [R]
    row = (2 * (radius + u * norm).square() + c * norm.square() - sq).float()  # [R]

    def close(block: slice, a0: int, b0: int) -> Tensor:
        return torch.addmm(column[None, a0:b0], low[block], low[a0:b0].T, alpha=-2) <= row[block, None]
    return close


_CACHE: dict[tuple[str, str], object] = {}


def duplicate_classes(lm) -> DuplicateClasses:
    """Duplicate-row classes of lm's embeddings, cached by the embedding's fingerprint."""
    key = (lm.embedding_fingerprint, "dups")
    if key not in _CACHE:
        _CACHE[key] = DuplicateClasses(lm.embedding_rows())
    return _CACHE[key]


def near_duplicates(lm) -> dict[int, list[int]]:
    """near_neighbours of lm's embedding rows, cached by the embedding's fingerprint."""
    key = (lm.embedding_fingerprint, "near")
    if key not in _CACHE:
        path = cache_dir() / "near" / f"v2-{lm.embedding_fingerprint}-{NEAR_REL:g}.json"  # v2: embedding only
        try:
            _CACHE[key] = {int(u): v for u, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError):
            _CACHE[key] = near_neighbours(lm.embedding_rows(), duplicate_classes(lm))
            write_json(path, _CACHE[key])
    return _CACHE[key]
