import copy

import torch

from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned import index as module
from sipit.invert.learned.index import ClusterIndex, balanced_clusters, load_or_build_index
from sipit.models import LayerTap

from .conftest import FAST


def test_every_cluster_probed_is_exact_scoring_and_clusters_are_balanced():
    """Rows with a dense clump (300 identical rows, 200 near one point): every cluster holds at most
    2·rows rows, each row is in one, and top1 over all clusters is the exact argmax of 2 r·P_v − g‖P_v‖²."""
    g = torch.Generator().manual_seed(0)
    P = torch.cat([torch.randn(1500, 16, generator=g), torch.ones(300, 16),
                   5 + 0.01 * torch.randn(200, 16, generator=g)])
    assign, centroids = balanced_clusters(P, 32)
    sizes = torch.bincount(assign, minlength=len(centroids))
    assert int(sizes.min()) >= 1 and int(sizes.max()) <= 64 and int(sizes.sum()) == len(P)
    index = ClusterIndex(P, assign, centroids, nprobe=len(centroids))
    r, gain = torch.randn(50, 16, generator=g) * 3, 0.7
    exact = (2 * r @ P.T - gain * (P ** 2).sum(1)).argmax(1)
    got = index.top1(r, gain)
    assert torch.equal(P[got], P[exact])  # (identical rows tie)
    near = index.top1(gain * P[:200] + 0.01 * torch.randn(200, 16, generator=g), gain, nprobe=2)
    assert float((P[near] == P[:200]).all(1).float().mean()) >= 0.95  # a residual near its row finds it cheaply


def test_index_is_built_once_cached_and_inverts_exactly(lm, cache, monkeypatch):
    """With clusters small enough for a tiny vocabulary, the learned policy screens its guesses
    through the index (built once, then loaded from the cache) and every prompt is still exact."""
    monkeypatch.setattr(module, "CLUSTER_ROWS", 8)
    monkeypatch.setattr(module, "SIMULATED", 256)
    engine = SipIt(lm, 1, InvertConfig(learned=FAST))
    cal = engine.policy.ranker.cal
    assert module.worth_indexing(cal)
    index = engine.policy.ranker.index
    assert index is not None and module.index_path(cal).exists()
    again = load_or_build_index(cal)
    assert again.nprobe == index.nprobe and torch.equal(again.assign, index.assign)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.tensor(lm.encode("The cat sat on the mat and looked at the dog.")[:12])]
    prompts += [torch.randint(0, lm.vocab_size, (12,), generator=g) for _ in range(3)]
    results = engine.invert_prompts([LayerTap(lm, 1).states(p) for p in prompts], [p.tolist() for p in prompts])
    assert all(r.exact for r in results)


def test_no_index_where_the_dense_screen_is_cheap(lm, cache, monkeypatch):
    """A vocabulary under 16 clusters, or a low-rank screen (rank < half the width): no index, no file."""
    engine = SipIt(lm, 1, InvertConfig(learned=FAST))
    assert engine.policy.ranker.index is None  # 256 tokens < 16 · CLUSTER_ROWS
    assert not list(cache.rglob("*.index-*"))
    monkeypatch.setattr(module, "CLUSTER_ROWS", 8)
    cal = copy.copy(engine.policy.ranker.cal)
    assert module.worth_indexing(cal)  # full rank, 256 ≥ 16 · 8
    cal.p_basis = cal.p_basis[:, :cal.P.shape[1] // 2 - 1]
    assert not module.worth_indexing(cal) and load_or_build_index(cal) is None
    assert not list(cache.rglob("*.index-*"))


def test_scored_counts_what_the_screens_read(lm, cache, monkeypatch):
    """The bench's candidates scored: every token per position of a dense screen; the index's
    centroids and probed rows only (fewer than the vocabulary)."""
    monkeypatch.setattr(module, "CLUSTER_ROWS", 8)
    monkeypatch.setattr(module, "SIMULATED", 256)
    target = LayerTap(lm, 1).states(torch.tensor(lm.encode("The cat sat on the mat.")[:8]))
    ranker = SipIt(lm, 1, InvertConfig(learned=FAST)).policy.ranker
    r = ranker.context_residuals(target)  # [7, d]
    before = ranker.scored
    ranker.screen(r)
    probed = ranker.scored - before
    assert len(r) * len(ranker.index.centroids) < probed < len(r) * lm.vocab_size
    index, ranker.index = ranker.index, None
    before = ranker.scored
    ranker.screen(r)
    ranker.position0(target[:1])
    assert ranker.scored - before == (len(r) + 1) * lm.vocab_size
    ranker.index = index
