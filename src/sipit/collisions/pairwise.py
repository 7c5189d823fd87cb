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


def min_pairwise(
    x: torch.Tensor,
    *,
    threshold: float = 1e-6,
    keep: int = 20,
    block: int = 1024,
    progress: bool = False,
    max_below: int = 100_000,
    hist_rows: int = 1024,
    seed: int = 0,
) -> PairwiseResult:
    """Exact closest pairs among the rows of x: Tensor[N, d] (any float dtype, CPU).

    block: rows per tile (see tile_grid); a tile is a [block, 4*block] float32 buffer (16 MiB
    at 1024), large enough for GEMM to run at full speed; the share computed in vain is ~block/N.
    hist_rows, seed: the histogram covers all pairs among `hist_rows` rows drawn with `seed`.
    """
    t_start = time.perf_counter()
    n, d = x.shape
    if n < 2 or keep < 1:
        raise ValueError(f"need at least 2 rows and keep >= 1, got n={n}, keep={keep}")
    x = x.detach().cpu()  # the truth: the original vectors, rechecked in float64
    block = min(block, n)
    A, B = torch.empty(n, d + 2), torch.empty(n, d + 2)  # screen operands, [N, d+2] each
    sq, mean_norm = _centre(x, out=A[:, :d])  # [N] centred squared norms (float64)
    if not math.isfinite(mean_norm):  # any NaN/inf entry makes its row norm NaN/inf
        raise ValueError("x has NaN or infinite entries")
    # Certified screen: fp32 GEMM of [a, (1-c)|a|^2, 1] . [-2b, 1, (1-c)|b|^2] is <= |a-b|^2 when
    # c >= 2*gamma_{d+2} (any-order dot-product error <= gamma_n*sum|terms| <= 2*gamma_n*(|a|^2+|b|^2),
    # gamma_n = n*u/(1-n*u), Higham Thm 3.5) + 8u (rounding the centred rows and norms to fp32).
    gamma = (d + 2) * U32 / (1 - (d + 2) * U32)
    c = 2.01 * gamma + 8 * U32
    torch.mul(A[:, :d], -2, out=B[:, :d])
    A[:, d] = B[:, d + 1] = (1 - c) * sq
    A[:, d + 1] = B[:, d] = 1

    def exact_d2(i: torch.Tensor, j: torch.Tensor) -> np.ndarray:
        """Squared distances of pairs (i[k], j[k]) in float64 on the original vectors."""
        return torch.cat(
            [(x[i[s : s + 8192]].double() - x[j[s : s + 8192]].double()).square().sum(1) for s in range(0, len(i), 8192)]
        ).numpy()

    thr2 = threshold**2 * (1 + 1e-9)
    best = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))  # i, j, d2 of the closest
    below: list[tuple[int, int, float]] = []
    n_below = n_cand = 0
    cutoff = math.inf  # upper bound on the final keep-th smallest d2 (or thr2 if larger)

    width, tiles = tile_grid(n, block)
    buf = torch.empty(block * width)
    lower = torch.zeros(block, block).masked_fill_(torch.ones(block, block, dtype=torch.bool).tril(), math.inf)
    with _fp32_highest():  # no TF32/bf16 shortcuts in the screen
        for i0, j0 in tqdm(tiles, disable=not progress, desc="pairwise", unit="tile"):
            a, b = A[i0 : i0 + block], B[j0 : j0 + width]
            t = torch.mm(a, b.T, out=buf[: len(a) * len(b)].view(len(a), len(b)))  # [bi, bj] screen
            if i0 == j0:  # keep i < j only
                k = min(len(a), len(b))
                t[:, :k] += lower[: len(a), :k]  # +inf on and below the diagonal
            rowmin = t.amin(1)  # [bi]
            if len(best[0]) < keep and (rowmin < math.inf).sum() >= keep:  # no cutoff yet:
                rows = rowmin.topk(keep, largest=False).indices  # take k pairs from distinct rows
                cols = t[rows].argmin(1)
                cutoff = max(thr2, exact_d2(rows + i0, cols + j0).max())
            lim = _f32_above(cutoff * (1 + 1e-9))
            if rowmin.min().item() > lim:
                continue  # the common case: nothing in this tile can matter
            rows = (rowmin <= lim).nonzero()[:, 0]
            r, col = (t[rows] <= lim).nonzero(as_tuple=True)
            i, j = rows[r] + i0, col + j0
            d2 = exact_d2(i, j)
            i, j = i.numpy(), j.numpy()
            n_cand += len(d2)
            hit = np.sqrt(d2) <= threshold
            n_below += int(hit.sum())
            below += list(zip(i[hit].tolist(), j[hit].tolist(), np.sqrt(d2[hit]).tolist()))[: max_below - len(below)]
            best = _smallest(*(np.concatenate(p) for p in zip(best, (i, j, d2))), keep)
            if len(best[0]) == keep:
                cutoff = max(thr2, best[2][-1])

    bi, bj, bd = best
    closest = [(int(p), int(q), math.sqrt(v)) for p, q, v in zip(bi, bj, bd)]
    below.sort(key=lambda p: (p[2], p[0], p[1]))
    return PairwiseResult(
        n=n, d=d, n_pairs=n * (n - 1) // 2,
        min_distance=closest[0][2], min_pair=closest[0][:2], closest=closest,
        below_threshold=n_below, below_pairs=below, threshold=threshold,
        mean_norm=mean_norm,
        histogram=_histogram(x, A[:, :d], sq, c, hist_rows, seed),
        candidates=n_cand, block=block, seconds=time.perf_counter() - t_start,
    )  # fmt: skip


def tile_grid(n: int, block: int) -> tuple[int, list[tuple[int, int]]]:
    """Tiles covering all pairs i<j: rows [i0, i0+block) x columns [j0, j0+width), j0 >= i0.
    Only the first tile of each row panel wastes work (its lower triangle). Returns width, tiles."""
    width = min(4 * block, n)
    return width, [(i0, j0) for i0 in range(0, n, block) for j0 in range(i0, n, width)]


def _centre(x: torch.Tensor, out: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, float]:
    """out[N, d] = fl32(x - mean(x)), centred in float64. Returns the centred squared norms
    [N] (float64) and the mean row norm of x. Chunked through one reused float64 buffer."""
    n = len(x)
    buf = torch.empty(min(chunk, n), x.shape[1], dtype=torch.float64)
    mu, norm_sum = torch.zeros(x.shape[1], dtype=torch.float64), 0.0
    for s in range(0, n, chunk):
        rows = buf[: len(x[s : s + chunk])].copy_(x[s : s + chunk])
        mu += rows.sum(0)
        norm_sum += torch.linalg.vector_norm(rows, dim=1).sum().item()
    mu /= n
    sq = torch.empty(n, dtype=torch.float64)
    for s in range(0, n, chunk):
        rows = buf[: len(x[s : s + chunk])].copy_(x[s : s + chunk]).sub_(mu)
        sq[s : s + chunk] = torch.linalg.vector_norm(rows, dim=1).square()
        out[s : s + chunk] = rows
    return sq, norm_sum / n


@contextmanager
def _fp32_highest():
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
    s, xs = sq[idx].float(), xc32[idx]
    d2 = torch.addmm(s[None, :] + s[:, None], xs, xs.T, alpha=-2)  # [m, m]
    upper = torch.ones_like(d2, dtype=torch.bool).triu_(1)
    i, j = ((d2 <= 1e3 * c * 2 * s.max()) & upper).nonzero(as_tuple=True)  # beyond fp32: recheck
    for k in range(0, len(i), 4096):  # chunked: with a few huge-norm rows every pair is "near"
        a, b = idx[i[k:k + 4096]], idx[j[k:k + 4096]]
        d2[i[k:k + 4096], j[k:k + 4096]] = (x[a].double() - x[b].double()).square().sum(1).float()
    d2 = d2[upper]
    counts = torch.bucketize(d2.clamp_min_(0).sqrt_(), torch.tensor(EDGES), right=True)
    counts = counts.bincount(minlength=len(EDGES) + 1).tolist()
    return {"edges": EDGES, "counts": counts, "rows": len(idx), "pairs": len(d2), "seed": seed}
