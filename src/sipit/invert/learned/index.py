"""ClusterIndex: the guesses' top-1 without reading every row of P, where the dense screen is costly.

score(v) = 2 r·P_v − g‖P_v‖² is largest where ‖r/g − P_v‖ is smallest, so a position's guess is
the row of P nearest to r/g. k-means splits P's rows into K clusters (about CLUSTER_ROWS rows each);
a query scores exactly only the rows of the `nprobe` clusters whose centroids are nearest. Like the
low-rank screen it replaces, it only orders: a guess it misses costs the loop a pass, never a wrong
token.

nprobe is chosen when the index is built, from the calibration's own noise model: the residual of
token v is g·P_v + ξ with ξ whitened (unit variance per dimension by construction of W); NOISE = 1.5
widens it (SmolLM2, the seed-5 bench prompts: held-out residuals ran 1.26–1.37 × √d at layers 1, 15
and 30). The smallest nprobe whose top-1 matches exact scoring on AGREE of SIMULATED such residuals
is kept; if none up to K/8 does, there is no index. AGREE trades the probes every prompt pays against
the passes a miss costs the few it hits (SmolLM2 layer 1: a miss costs a pass, about a forward; 4
clusters a query 1.3 ms a prompt, 8 2.1 ms, 16 3.2 ms; agreement on 4,096 simulated residuals
0.987–0.991, 0.996–0.999 and 0.999–1.0; at 0.999 of 1,024 one residual chose between 8 and 16).
Built only where the screen's rank is at least half the width (there a dense screen costs about a
full product: SmolLM2 layer 1, rank 512 of 576), on a CPU (on a GPU one dense product is cheaper than
many small ones), and cached beside the calibration.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import Tensor

from ...models.load import cache_dir
from .cache import Calibration

CLUSTER_ROWS = 128  # rows of P per cluster on average (at most twice that)
TRAIN_ROWS = 16_384  # rows k-means fits its centroids on (then every row is assigned)
ITERATIONS = 10
NOISE = 1.5  # simulated residual noise, in whitened units
SIMULATED = 4096  # simulated residuals choosing nprobe
AGREE = 0.98  # top-1 agreement with exact scoring that nprobe must reach
INDEX_VERSION = 1  # bump when what is built or stored changes (the constants above are in the file name)


class ClusterIndex:
    """centroids [K, d]; rows [V, d]: P's rows grouped by cluster (cluster c is rows[starts[c]:starts[c+1]]),
    ids [V]: their token ids, sq [V]: their squared norms; nprobe: clusters scanned per query. Every
    cluster is non-empty (balanced_clusters). scored: tokens scored so far, centroids included."""

    def __init__(self, P: Tensor, assign: Tensor, centroids: Tensor, nprobe: int):
        order = assign.argsort(stable=True)
        self.assign, self.centroids, self.nprobe = assign, centroids.float().contiguous(), nprobe
        self.c_sq = (self.centroids ** 2).sum(1)
        self.ids, self.rows = order, P.float()[order].contiguous()
        self.sq = (self.rows.double() ** 2).sum(1).float()
        counts = torch.bincount(assign, minlength=len(centroids))
        self.sizes, self.scored = counts, 0
        self.starts = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])  # [K + 1]
        bounds = self.starts.tolist()
        self.rows_of = [self.rows[s:e] for s, e in zip(bounds, bounds[1:])]  # per cluster [size, d] (views)
        self.sq_of = [self.sq[s:e, None] for s, e in zip(bounds, bounds[1:])]  # [size, 1]

    def top1(self, r: Tensor, g: float, nprobe: int | None = None) -> Tensor:
        """argmax_v 2 r·P_v − g‖P_v‖² over the rows of each query's nprobe nearest clusters: r [n, d] -> ids [n].
        The queries are grouped by cluster, so each probed cluster is one product over contiguous rows."""
        nprobe = nprobe or self.nprobe
        r = r.float()
        near = (2 * r @ self.centroids.T - g * self.c_sq).topk(nprobe, dim=1).indices  # [n, nprobe]
        self.scored += len(r) * len(self.centroids) + int(self.sizes[near].sum())
        clusters, order = near.flatten().sort(stable=True)  # (query, probed cluster) pairs by cluster
        rq = r[order // nprobe]  # [n·nprobe, d]: each pair's query, in cluster order
        values, where, at = [], [], 0
        for c, k in zip(*(x.tolist() for x in clusters.unique_consecutive(return_counts=True))):
            # 2 P_v·r − g‖P_v‖² over the cluster's rows [size, k], best per query (Python overhead dominates:
            # few ops). Rows times queries, not queries times rows: 50-70 µs a cluster against 73-97 (MKL, this
            # project's AVX2-only CPU)
            best = torch.addmm(self.sq_of[c], self.rows_of[c], rq[at:at + k].T, beta=-g, alpha=2).max(0)
            values.append(best.values)
            where.append(best.indices)
            at += k
        score = torch.empty(len(order)).scatter_(0, order, torch.cat(values)).view(-1, nprobe)  # [n, nprobe]
        arg = torch.empty(len(order), dtype=torch.long).scatter_(0, order, torch.cat(where) + self.starts[clusters])
        arg = arg.view(-1, nprobe).gather(1, score.argmax(1, keepdim=True))[:, 0]
        return self.ids[arg].to(r.device)

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        save_file({"assign": self.assign.int().contiguous(), "centroids": self.centroids},
                  str(tmp), metadata={"nprobe": str(self.nprobe)})
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, P: Tensor) -> "ClusterIndex":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return cls(P, f.get_tensor("assign").long(), f.get_tensor("centroids"), int(f.metadata()["nprobe"]))


def _nearest(X: Tensor, C: Tensor, chunk: int = 8192) -> Tensor:
    """Index of the nearest row of C [K, d] for every row of X [n, d]. [n]"""
    c_sq = (C ** 2).sum(1)
    return torch.cat([(c_sq - 2 * x @ C.T).argmin(1) for x in X.split(chunk)])


def kmeans(X: Tensor, K: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Lloyd's k-means fitted on TRAIN_ROWS sampled rows of X [V, d]; -> (assignment of every row [V], centroids [K, d])."""
    g = torch.Generator().manual_seed(seed)
    sample = X[torch.randperm(len(X), generator=g)[:TRAIN_ROWS]]
    C = sample[torch.randperm(len(sample), generator=g)[:K]].clone()
    for _ in range(ITERATIONS):
        a = _nearest(sample, C)
        counts = torch.bincount(a, minlength=K)[:, None]
        sums = torch.zeros_like(C).index_add_(0, a, sample)
        C = torch.where(counts > 0, sums / counts.clamp_min(1), C)  # an empty cluster keeps its centroid
    return _nearest(X, C), C


def balanced_clusters(X: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """k-means into about len(X) / rows clusters, then every cluster over 2·rows split again by k-means
    (then, if its rows will not separate, into chunks): a query's cost is the rows of the clusters it
    probes, and plain k-means of token rows leaves a few huge ones (SmolLM2 layer 1, K = 192: median 22
    rows, largest 4,449, and queries land in them). -> (assignment [V], centroids [K', d])"""
    assign, C = kmeans(X, max(1, len(X) // rows))
    parts, members = [], [(assign == c).nonzero()[:, 0] for c in range(len(C))]
    while members:
        m = members.pop()
        if len(m) <= 2 * rows:
            if len(m):
                parts.append(m)
            continue
        sub, _ = kmeans(X[m], -(-len(m) // rows))
        split = [m[sub == c] for c in range(int(sub.max()) + 1)]
        if max(len(x) for x in split) == len(m):  # inseparable (identical rows): chunks
            split = list(m.split(rows))
        members += split
    assign = torch.empty(len(X), dtype=torch.long)
    for c, m in enumerate(parts):
        assign[m] = c
    centroids = torch.stack([X[m].mean(0) for m in parts])
    return assign, centroids


def choose_nprobe(index: ClusterIndex, P: Tensor, P_sq: Tensor, g: float, seed: int = 1) -> int | None:
    """The smallest nprobe (powers of 2 up to K/8) whose top-1 on simulated residuals g·P_v + NOISE·ξ
    matches exact scoring on AGREE of them, or None."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randperm(len(P), generator=gen)[:SIMULATED]
    r = g * P[v] + NOISE * torch.randn(len(v), P.shape[1], generator=gen)
    exact = torch.cat([(2 * x @ P.T - g * P_sq).argmax(1) for x in r.split(256)])
    nprobe = 1
    while nprobe <= len(index.centroids) // 8:
        if float((index.top1(r, g, nprobe) == exact).float().mean()) >= AGREE:
            return nprobe
        nprobe *= 2
    return None


def worth_indexing(cal: Calibration) -> bool:
    """Where the dense screen costs about a full product (rank ≥ half the width), on a CPU."""
    return cal.P.device.type == "cpu" and 2 * cal.p_basis.shape[1] >= cal.P.shape[1] \
        and len(cal.P) >= 16 * CLUSTER_ROWS


def index_path(cal: Calibration) -> Path:
    settings = f"{CLUSTER_ROWS}-{TRAIN_ROWS}-{ITERATIONS}-{NOISE}-{SIMULATED}-{AGREE}-{INDEX_VERSION}"
    return cache_dir() / "learned" / f"{cal.key}.index-{settings}.safetensors"


def load_or_build_index(cal: Calibration) -> ClusterIndex | None:
    """The cached index of a calibration's P, or built now (a few seconds; cached); None where it does
    not pay (worth_indexing) or no nprobe reaches AGREE (a marker file remembers that)."""
    if not worth_indexing(cal):
        return None
    path = index_path(cal)
    none = path.with_suffix(".none")
    if none.exists():
        return None
    if path.exists():
        try:
            return ClusterIndex.load(path, cal.P)
        except Exception:  # corrupt: rebuilt below
            pass
    print(f"sipit: indexing the ranker's {len(cal.P)} token rows (one-time; cached)", file=sys.stderr)
    P = cal.P.float()
    assign, centroids = balanced_clusters(P, CLUSTER_ROWS)
    index = ClusterIndex(P, assign, centroids, 1)
    nprobe = choose_nprobe(index, P, cal.P_sq.float(), cal.gain)
    path.parent.mkdir(parents=True, exist_ok=True)
    if nprobe is None:
        none.touch()
        return None
    index.nprobe, index.scored = nprobe, 0  # (the simulation's scores are not the inversion's)
    index.save(path)
    return index
