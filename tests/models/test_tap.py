"""Lock-step passes: many prompts' extends in one forward pass equal each extend alone."""
import pytest
import torch

from sipit.models import LayerTap
from sipit.models.surfaces import KVTap, ProjectedTap


def taps(lm):
    return [LayerTap(lm, 2), LayerTap(lm, 0), LayerTap(lm, lm.n_layers, final_norm=True), KVTap(lm, 3, "both"),
            ProjectedTap(lm, 2, torch.randn(8, lm.d_model, generator=torch.Generator().manual_seed(1)))]


@pytest.mark.parametrize("which", range(5))
def test_extend_many_equals_each_extend_alone(tiny_lm, which):
    """Prefixes of different lengths (empty included), rows of 1 and of several tokens, several requests
    per pass: every state equals its own extend, and each grown prefix continues like a fresh forward."""
    tap = taps(tiny_lm)[which]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, tiny_lm.vocab_size, (3, 12), generator=g)
    shapes = [(0, 5, 4, 1), (1, 0, 1, 7), (2, 9, 2, 3), (1, 2, 3, 1), (2, 3, 1, 4), (0, 5, 2, 6)]
    requests = [(tap.prefill(ids[p, :t]), torch.randint(0, tiny_lm.vocab_size, (n, k), generator=g))
                for p, t, n, k in shapes]
    for max_tokens in (1024, 8):  # one pass per kind of row, or many small passes
        for (prefix, rows), (h, grown) in zip(requests, tap.extend_many(requests, max_tokens)):
            alone = tap.extend(prefix, rows)
            assert h.shape == alone.shape
            assert torch.allclose(h, alone, rtol=1e-5, atol=1e-5 * float(alone.abs().max()))
            b, n = rows.shape[0] - 1, rows.shape[1]
            grown_prefix = grown(b, n)
            assert grown_prefix.ids.tolist() == prefix.ids.tolist() + rows[b].tolist()
            nxt = torch.randint(0, tiny_lm.vocab_size, (2, 2), generator=g)
            full = tap.states(torch.cat([grown_prefix.ids.expand(2, -1), nxt], 1))[:, -2:]
            assert torch.allclose(tap.extend(grown_prefix, nxt), full, rtol=1e-5, atol=1e-5 * float(full.abs().max()))


def test_pack_trades_padding_for_passes():
    """Rows of one length share a pass; a few long rows do not pad many short ones when a pass costs
    less than the padding (PASS_TOKENS); max_tokens splits a pass, a single larger request runs alone."""
    from sipit.models.tap import PASS_TOKENS, pack

    assert pack([(1, 20)] * 4, 1024) == [[0, 1, 2, 3]]
    shapes = [(1, 20)] * 2 + [(1, 2)] * 30  # one pass: 32 rows · 20; two: 2 · 20 + 30 · 2 + a pass
    assert 32 * 20 > 2 * 20 + 30 * 2 + PASS_TOKENS and pack(shapes, 1024) == [[0, 1], list(range(2, 32))]
    assert pack([(1, 10)] * 4, 20) == [[0, 1], [2, 3]]
    assert pack([(5, 10), (1, 3)], 20) == [[0], [1]]
