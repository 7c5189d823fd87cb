"""Exact minimum pairwise L2 distance among N vectors (e.g. hidden states of N prompts).

All N(N-1)/2 pairs i<j are screened with a float32 GEMM on mean-centred rows, tile by tile
(the N x N matrix is never built). The screen yields a certified *lower bound* of every
squared distance, so a pair is skipped only if it provably cannot be among the `keep` closest
nor below `threshold`. Every pair that survives is rechecked directly in float64 as ||a - b||
on the original vectors, so all reported distances are exact up to float64 rounding.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

U32 = 2.0**-24  # unit roundoff of float32
EDGES = [10.0 ** (e / 4) for e in range(-32, 17)]  # histogram bin edges: 1e-8 .. 1e4, 4 per decade


@dataclass
class PairwiseResult:
    n: int  # number of vectors
    d: int  # their dimension
    n_pairs: int  # n(n-1)/2, all of them covered by the exact search
    min_distance: float  # exact (float64) minimum over all pairs i<j
    min_pair: tuple[int, int]
    closest: list[tuple[int, int, float]]  # the `keep` closest pairs (i, j, distance), sorted
    below_threshold: int  # exact number of pairs with distance <= threshold
    below_pairs: list[tuple[int, int, float]]  # those pairs, sorted (first `max_below` found)
    threshold: float
    mean_norm: float  # mean L2 norm of the rows, to express distances relative to it
    histogram: dict  # distance counts over all pairs of a row subsample, see _histogram
    candidates: int  # pairs the screen could not rule out, rechecked in float64
    block: int  # rows per tile used
    seconds: float

    def relative(self, distance: float) -> float:
        """distance / mean row norm (0 if all rows are zero)."""
        return distance / self.mean_norm if self.mean_norm > 0 else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["min_relative_distance"] = self.relative(self.min_distance)
        return out


PANEL_PAIRS = 2**28  # pairs per task of the search (a row panel): ~seconds of GEMM on one core


@dataclass
class Panel:
    """What the search of one row panel found; panels merge exactly (see merge_panels)."""

    i: np.ndarray  # the `keep` closest pairs (i, j, squared distance), sorted by (d2, i, j)
    j: np.ndarray
    d2: np.ndarray
    below: list[tuple[int, int, float]]  # pairs at distance <= threshold (the first max_below)
    n_below: int  # exact count of those pairs
    candidates: int  # pairs rechecked in float64
    block: int  # rows per tile used (halved after an out-of-memory error)


def min_pairwise(
    x: torch.Tensor,
    *,
    threshold: float = 1e-6,
    keep: int = 20,
    block: int | None = None,
    progress: bool = False,
    max_below: int = 100_000,
    hist_rows: int = 1024,
    seed: int = 0,
    engine=None,
    panel_pairs: int | None = None,
) -> PairwiseResult:
    """Exact closest pairs among the rows of x: Tensor[N, d] (any float dtype, on any device: the
    screen and the float64 recheck run where x is).

    The rows i are cut into panels of about `panel_pairs` (default PANEL_PAIRS) pairs (i, j > i),
    each one task of `engine` (sipit.engines; default: in this process). A panel's `keep` closest
    pairs are exact, so the `keep` smallest of their union are the global ones, and below-threshold
    counts add up.
    block: rows per tile (see tile_grid); default from the free memory of x's device. A tile is a
    [block, 4*block] float32 buffer (16 MiB at 1024); the share computed in vain is ~block/N.
    hist_rows, seed: the histogram covers all pairs among `hist_rows` rows drawn with `seed`.
    """
    from ..engines import LocalEngine

    t_start = time.perf_counter()
    n, d = x.shape
    if n < 2 or keep < 1:
        raise ValueError(f"need at least 2 rows and keep >= 1, got n={n}, keep={keep}")
    x = x.detach()  # the truth: the original vectors, rechecked in float64
    A, B, sq, mean_norm, c = _operands(x)
    if not math.isfinite(mean_norm):  # any NaN/inf entry makes its row norm NaN/inf
        raise ValueError("x has NaN or infinite entries")
    block = min(block or default_block(x.device), n)
    engine = engine or LocalEngine()
    local = isinstance(engine, LocalEngine)  # else x travels through Ray's object store, from the CPU
    job = dict(x=x if local else x.cpu(), device=str(x.device), threshold=threshold, keep=keep, block=block,
               max_below=max_below, operands=(A, B) if local else None)  # a Ray worker makes its own
    bounds = panels(n, panel_pairs or PANEL_PAIRS)
    found = []
    bar = tqdm(total=len(bounds), disable=not progress, desc="pairwise", unit="panel")
    for _, panel in engine.map(search_panel, bounds, job, gpu=x.device.type == "cuda"):
        found.append(panel)
        bar.update()
    bar.close()
    return merge_panels(found, x, A, sq, c, dict(threshold=threshold, keep=keep, max_below=max_below,
                                                 hist_rows=hist_rows, seed=seed, mean_norm=mean_norm),
                        time.perf_counter() - t_start)


def panels(n: int, panel_pairs: int = PANEL_PAIRS) -> list[tuple[int, int]]:
    """Row ranges [r0, r1) covering 0..n with about `panel_pairs` pairs (i, j > i) each."""
    total = n * (n - 1) // 2
    k = max(1, math.ceil(total / max(panel_pairs, 1)))
    # rows before r hold r*(n-1) - r*(r-1)/2 pairs: cut where that reaches total*m/k
    cuts = [0] + [min(n, max(1, round((2 * n - 1 - math.sqrt((2 * n - 1) ** 2 - 8 * total * m / k)) / 2)))
                  for m in range(1, k)] + [n]
    cuts = sorted(set(cuts))
    return list(zip(cuts[:-1], cuts[1:]))


def default_block(device: torch.device) -> int:
    """Rows per tile: 1024 on CPU; on a GPU the largest power of two whose tile buffer
    ([block, 4*block] float32) takes at most 1/8 of the free memory, up to 8192."""
    if device.type != "cuda":
        return 1024
    free, _ = torch.cuda.mem_get_info(device)
    block = 1024
    while block < 8192 and 16 * (2 * block) ** 2 <= free / 8:
        block *= 2
    return block


def search_panel(job: dict, rows: tuple[int, int]) -> Panel:
    """The exact search of all pairs (i, j) with i in rows = [r0, r1), j > i (an engine task).
    On a device's out-of-memory error the block is halved and the panel searched again."""
    block, x = job["block"], job["x"].to(job["device"])
    while True:
        try:
            return _search(x, job["operands"] or _operands(x)[:2], rows, block, job["threshold"], job["keep"],
                           job["max_below"])
        except torch.OutOfMemoryError:
            if block <= 16:
                raise
            block //= 2
            torch.cuda.empty_cache()


def _operands(x: torch.Tensor):
    """The certified screen's operands on x's device: A, B [N, d+2] float32, the centred squared
    norms sq [N] (float64), the mean row norm, and the error constant c.

    fp32 GEMM of [a, (1-c)|a|^2, 1] . [-2b, 1, (1-c)|b|^2] is <= |a-b|^2 when c >= 2*gamma_{d+2}
    (any-order dot-product error <= gamma_n*sum|terms| <= 2*gamma_n*(|a|^2+|b|^2),
    gamma_n = n*u/(1-n*u), Higham Thm 3.5) + 8u (rounding the centred rows and norms to fp32)."""
    n, d = x.shape
    A, B = torch.empty(n, d + 2, device=x.device), torch.empty(n, d + 2, device=x.device)
    sq, mean_norm = _centre(x, out=A[:, :d])
    gamma = (d + 2) * U32 / (1 - (d + 2) * U32)
    c = 2.01 * gamma + 8 * U32
    torch.mul(A[:, :d], -2, out=B[:, :d])
    A[:, d] = B[:, d + 1] = (1 - c) * sq
    A[:, d + 1] = B[:, d] = 1
    return A, B, sq, mean_norm, c


def _exact_d2(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> np.ndarray:
    """Squared distances of pairs (i[k], j[k]) in float64 on the original vectors."""
    return torch.cat([(x[i[s : s + 8192]].double() - x[j[s : s + 8192]].double()).square().sum(1)
                      for s in range(0, len(i), 8192)]).cpu().numpy()


def _search(x: torch.Tensor, operands: tuple[torch.Tensor, torch.Tensor], rows: tuple[int, int], block: int,
            threshold: float, keep: int, max_below: int) -> Panel:
    """Screen the tiles of row panel `rows` with the certified fp32 GEMM on the operands (A, B) of
    _operands(x); recheck in float64 every pair that could be among the `keep` closest or below
    `threshold`."""
    A, B = operands
    dev = x.device
    thr2 = threshold**2 * (1 + 1e-9)
    best = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))  # i, j, d2 of the closest
    below: list[tuple[int, int, float]] = []
    n_below = n_cand = 0
    cutoff = math.inf  # upper bound on the final keep-th smallest d2 (or thr2 if larger)

    width, tiles = tile_grid(len(x), block, rows)
    buf = torch.empty(block * width, device=dev)
    lower = torch.zeros(block, block, device=dev).masked_fill_(
        torch.ones(block, block, dtype=torch.bool, device=dev).tril(), math.inf)
    with fp32_highest():  # no TF32/bf16 shortcuts in the screen
        for i0, j0 in tiles:
            a, b = A[i0 : min(i0 + block, rows[1])], B[j0 : j0 + width]
            t = torch.mm(a, b.T, out=buf[: len(a) * len(b)].view(len(a), len(b)))  # [bi, bj] screen
            if i0 == j0:  # keep i < j only
                k = min(len(a), len(b))
                t[:, :k] += lower[: len(a), :k]  # +inf on and below the diagonal
            rowmin = t.amin(1)  # [bi]
            if len(best[0]) < keep and (rowmin < math.inf).sum() >= keep:  # no cutoff yet:
                r = rowmin.topk(keep, largest=False).indices  # take k pairs from distinct rows
                cutoff = max(thr2, _exact_d2(x, r + i0, t[r].argmin(1) + j0).max())
            lim = _f32_above(cutoff * (1 + 1e-9))
            if rowmin.min().item() > lim:
                continue  # the common case: nothing in this tile can matter
            sel = (rowmin <= lim).nonzero()[:, 0]
            r, col = (t[sel] <= lim).nonzero(as_tuple=True)
            i, j = sel[r] + i0, col + j0
            d2 = _exact_d2(x, i, j)
            i, j = i.cpu().numpy(), j.cpu().numpy()
            n_cand += len(d2)
            hit = np.sqrt(d2) <= threshold
            n_below += int(hit.sum())
            below += list(zip(i[hit].tolist(), j[hit].tolist(), np.sqrt(d2[hit]).tolist()))[: max_below - len(below)]
            best = _smallest(*(np.concatenate(p) for p in zip(best, (i, j, d2))), keep)
            if len(best[0]) == keep:
                cutoff = max(thr2, best[2][-1])
    return Panel(*best, below=below, n_below=n_below, candidates=n_cand, block=block)


def merge_panels(found: list[Panel], x, A, sq, c, p: dict, seconds: float) -> PairwiseResult:
    """The exact global result from the panels' exact partial ones."""
    n, d = x.shape
    bi, bj, bd = _smallest(*(np.concatenate([getattr(f, k) for f in found]) for k in ("i", "j", "d2")), p["keep"])
    closest = [(int(i), int(j), math.sqrt(v)) for i, j, v in zip(bi, bj, bd)]
    below = sorted((b for f in found for b in f.below), key=lambda q: (q[2], q[0], q[1]))[: p["max_below"]]
    return PairwiseResult(
        n=n, d=d, n_pairs=n * (n - 1) // 2,
        min_distance=closest[0][2], min_pair=closest[0][:2], closest=closest,
        below_threshold=sum(f.n_below for f in found), below_pairs=below, threshold=p["threshold"],
        mean_norm=p["mean_norm"], histogram=_histogram(x, A[:, :d], sq, c, p["hist_rows"], p["seed"]),
        candidates=sum(f.candidates for f in found), block=min(f.block for f in found), seconds=seconds,
    )  # fmt: skip


def tile_grid(n: int, block: int, rows: tuple[int, int] | None = None) -> tuple[int, list[tuple[int, int]]]:
    """Tiles covering all pairs i<j with i in rows (default all): rows [i0, i0+block) x columns
    [j0, j0+width), j0 >= i0. Only the first tile of each row band wastes work (its lower
    triangle). Returns width, tiles."""
    r0, r1 = rows or (0, n)
    width = min(4 * block, n)
    return width, [(i0, j0) for i0 in range(r0, r1, block) for j0 in range(i0, n, width)]


def _centre(x: torch.Tensor, out: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, float]:
    """out[N, d] = fl32(x - mean(x)), centred in float64. Returns the centred squared norms
    [N] (float64) and the mean row norm of x. Chunked through one reused float64 buffer."""
    n = len(x)
    buf = torch.empty(min(chunk, n), x.shape[1], dtype=torch.float64, device=x.device)
    mu, norm_sum = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device), 0.0
    for s in range(0, n, chunk):
        rows = buf[: len(x[s : s + chunk])].copy_(x[s : s + chunk])
        mu += rows.sum(0)
        norm_sum += torch.linalg.vector_norm(rows, dim=1).sum().item()
    mu /= n
    sq = torch.empty(n, dtype=torch.float64, device=x.device)
    for s in range(0, n, chunk):
        rows = buf[: len(x[s : s + chunk])].copy_(x[s : s + chunk]).sub_(mu)
        sq[s : s + chunk] = torch.linalg.vector_norm(rows, dim=1).square()
        out[s : s + chunk] = rows
    return sq, norm_sum / n


@contextmanager
def fp32_highest():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _smallest(i: np.ndarray, j: np.ndarray, d2: np.ndarray, k: int):
    """The k smallest pairs by (d2, i, j) -- ties broken by index so results are deterministic."""
    order = np.lexsort((j, i, d2))[:k]
    return i[order], j[order], d2[order]


def _f32_above(v: float) -> float:
    """Smallest float32 >= v (comparisons with a float32 tensor round the scalar to float32)."""
    if v >= np.finfo(np.float32).max:
        return float(np.finfo(np.float32).max)
    f = np.float32(v)
    return float(f if f >= v else np.nextafter(f, np.float32(np.inf)))


def _histogram(x: torch.Tensor, xc32: torch.Tensor, sq: torch.Tensor, c: float, rows: int, seed: int) -> dict:
    """Distance counts over all pairs among `rows` rows drawn with `seed`: centred fp32 GEMM,
    with pairs within 1000x its error bound recomputed in float64, so every distance is right to
    well within a bin. counts[0]: < edges[0] (incl. 0); counts[k]: [edges[k-1], edges[k]);
    counts[-1]: >= edges[-1]."""
    n = len(xc32)
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: min(rows, n)].sort().values
    idx = idx.to(x.device)
    s, xs = sq[idx].float(), xc32[idx]
    d2 = torch.addmm(s[None, :] + s[:, None], xs, xs.T, alpha=-2)  # [m, m]
    upper = torch.ones_like(d2, dtype=torch.bool).triu_(1)
    i, j = ((d2 <= 1e3 * c * 2 * s.max()) & upper).nonzero(as_tuple=True)  # beyond fp32: recheck
    for k in range(0, len(i), 4096):  # chunked: with a few huge-norm rows every pair is "near"
        a, b = idx[i[k:k + 4096]], idx[j[k:k + 4096]]
        d2[i[k:k + 4096], j[k:k + 4096]] = (x[a].double() - x[b].double()).square().sum(1).float()
    d2 = d2[upper]
    counts = torch.bucketize(d2.clamp_min_(0).sqrt_(), torch.tensor(EDGES, device=d2.device), right=True)
    counts = counts.bincount(minlength=len(EDGES) + 1).tolist()
    return {"edges": EDGES, "counts": counts, "rows": len(idx), "pairs": len(d2), "seed": seed}
