import json

import numpy as np
import pytest
import torch

from sipit.collisions.pairwise import min_pairwise


def hidden_like(n, d, seed):
    """Float32 rows of norm ~400 dominated by a common offset, like real hidden states."""
    g = torch.Generator().manual_seed(seed)
    offset = torch.randn(d, generator=g, dtype=torch.float64)
    offset *= 380 / offset.norm()
    z = torch.randn(n, d, generator=g, dtype=torch.float64) * (120 / d**0.5)
    return (offset + z).float()


def reference(x, threshold):
    """Brute force: all pairs i<j, direct float64 ||a - b||, sorted by (distance, i, j)."""
    x64 = x.double()
    dist = torch.cdist(x64, x64, compute_mode="donot_use_mm_for_euclid_dist")
    i, j = torch.triu_indices(len(x), len(x), 1).numpy()
    v = dist.numpy()[i, j]
    order = np.lexsort((j, i, v))
    pairs = list(zip(i[order].tolist(), j[order].tolist(), v[order].tolist()))
    return pairs, [p for p in pairs if p[2] <= threshold]


def test_planted_tiny_distances():
    n, d = 3000, 576
    x = hidden_like(n, d, seed=0)
    # plant pairs at distance exactly 0, ~1e-7 and ~1e-5: the partner is a copy that differs in one
    # coordinate, set to 0 in the original and to a tiny float32 value in the copy, so the true
    # distance is that value (1e-7 itself is not reachable by perturbing a coordinate of size ~16)
    planted = {(11, 2500): 0.0, (700, 1800): 1e-7, (1234, 2999): 1e-5}
    for k, ((p, q), delta) in enumerate(planted.items()):
        x[q] = x[p]
        x[p, 100 + k] = 0.0
        x[q, 100 + k] = delta
    exact = {pq: float(x[pq[1], 100 + k]) for k, pq in enumerate(planted)}  # float32 value, as float64

    # the test is meaningful: a naive float32 GEMM screen ||a||^2 + ||b||^2 - 2ab errs by far more
    # than the planted squared distances (<= 1e-10), so it cannot tell 0 from 1e-5
    sq = x.square().sum(1)
    naive = sq[:, None] + sq[None, :] - 2 * x @ x.T
    p, q = zip(*planted)
    assert (naive[p, q].double() - torch.tensor(list(exact.values())) ** 2).abs().max() > 1e-6

    r = min_pairwise(x, threshold=1e-6, keep=5)
    assert r.min_distance == 0.0 and r.min_pair == (11, 2500)
    # the float64 recheck of float32 inputs differing in one coordinate is exact up to fp64 rounding
    for (i, j, dist), ((p, q), want) in zip(r.closest[:3], exact.items()):
        assert (i, j) == (p, q)
        assert abs(dist - want) <= 1e-12 * want
    assert r.closest[3][2] > 1.0  # random rows are far apart
    assert r.below_threshold == 2
    assert [(i, j) for i, j, _ in r.below_pairs] == [(11, 2500), (700, 1800)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("dups", [False, True])
def test_matches_brute_force(seed, dups):
    g = torch.Generator().manual_seed(seed)
    n, d = [200, 333, 500, 417][seed], [576, 64, 16, 128][seed]
    x = hidden_like(n, d, seed)
    if dups:  # exact duplicates and near-duplicates
        src, dst = torch.randperm(n, generator=g)[:12].view(2, 6)
        x[dst] = x[src]
        x[dst[:3], 0] += torch.tensor([1e-6, 3e-6, 1e-4])
    pairs, _ = reference(x, 0.0)
    k = len(pairs) // 100  # threshold in a gap between distances, ~1% of pairs below it
    while pairs[k + 1][2] - pairs[k][2] < 1e-9 * pairs[k][2]:  # duplicate rows make ties
        k += 1
    threshold = (pairs[k][2] + pairs[k + 1][2]) / 2
    below = pairs[: k + 1]
    for block, panel_pairs in [(4096, None), (64, None), (97, None), (64, 997)]:  # 997: many row panels
        r = min_pairwise(x, threshold=threshold, keep=20, block=block, panel_pairs=panel_pairs)
        assert r.n_pairs == len(pairs)
        assert r.min_distance == pytest.approx(pairs[0][2], rel=1e-12, abs=1e-300)
        assert r.min_pair == pairs[0][:2]
        assert [p[:2] for p in r.closest] == [p[:2] for p in pairs[:20]]
        assert np.allclose([p[2] for p in r.closest], [p[2] for p in pairs[:20]], rtol=1e-12, atol=0)
        assert r.below_threshold == len(below)
        assert [p[:2] for p in r.below_pairs] == [p[:2] for p in below]


def test_many_duplicates_dtypes_and_json():
    x = hidden_like(300, 32, seed=5)
    x[250:] = x[0]  # 51 equal rows: 1275 pairs at distance 0, more than keep and max_below
    for dtype in [torch.float32, torch.float64, torch.float16]:
        r = min_pairwise(x.to(dtype), keep=10, max_below=100, block=128)
        assert r.min_distance == 0.0 and r.min_pair == (0, 250)
        assert r.below_threshold == 51 * 50 // 2
        assert len(r.below_pairs) == 100
        assert [p[2] for p in r.closest] == [0.0] * 10
    out = json.loads(json.dumps(r.to_dict()))
    assert out["min_relative_distance"] == 0.0
    h = out["histogram"]
    assert sum(h["counts"]) == h["pairs"] == 300 * 299 // 2 and len(h["counts"]) == len(h["edges"]) + 1
    assert h["counts"][0] == 1275  # the zero-distance pairs land in the underflow bin


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        min_pairwise(torch.zeros(1, 4))
    with pytest.raises(ValueError):
        min_pairwise(torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]))


def test_distances_below_screen_resolution():
    # float64 rows whose pairwise distances are all sqrt(2) up to ~1e-7: far below what the fp32
    # screen can resolve, so the engine must recheck every pair and still rank them exactly
    g = torch.Generator().manual_seed(7)
    n = 300
    x = 400 / n**0.5 + torch.eye(n, dtype=torch.float64) + 1e-7 * torch.randn(n, n, generator=g, dtype=torch.float64)
    pairs, _ = reference(x, 0.0)
    threshold = (pairs[999][2] + pairs[1000][2]) / 2
    r = min_pairwise(x, threshold=threshold, keep=20, block=128)
    assert [p[:2] for p in r.closest] == [p[:2] for p in pairs[:20]]
    assert np.allclose([p[2] for p in r.closest], [p[2] for p in pairs[:20]], rtol=1e-12, atol=0)
    assert r.below_threshold == 1000


def test_out_of_memory_halves_the_block(monkeypatch):
    from sipit.collisions import pairwise

    x = hidden_like(300, 32, seed=3)
    want = min_pairwise(x, keep=10, block=256)
    real, tried = pairwise._search, []

    def small_memory(x, operands, rows, block, *a):
        tried.append(block)
        if block > 64:
            raise torch.OutOfMemoryError("simulated")
        return real(x, operands, rows, block, *a)
    monkeypatch.setattr(pairwise, "_search", small_memory)
    r = min_pairwise(x, keep=10, block=256)
    assert tried == [256, 128, 64] and r.block == 64
    assert r.closest == want.closest and r.below_threshold == want.below_threshold


@pytest.mark.cuda
def test_cuda_equals_cpu():
    x = hidden_like(5000, 576, seed=4)
    x[4000] = x[17]
    x[4001] = x[18] + 1e-5
    cpu, gpu = min_pairwise(x, keep=20), min_pairwise(x.cuda(), keep=20)
    assert [p[:2] for p in gpu.closest] == [p[:2] for p in cpu.closest]
    assert np.allclose([p[2] for p in gpu.closest], [p[2] for p in cpu.closest], rtol=1e-12, atol=1e-12)
    assert gpu.below_threshold == cpu.below_threshold == 1
