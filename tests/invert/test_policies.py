"""Candidate policies: what they rank and what they charge to the loop's cost counter."""
import pytest
import torch

from sipit.invert import GradientConfig, InvertConfig, invert
from sipit.models import LayerTap, load_model

torch.set_num_threads(1)

FAST = dict(calibration_tokens=8192, gradient=GradientConfig(steps=40))


@pytest.fixture(scope="module", params=["tiny-gpt2", "tiny-llama"])
def lm(request):
    return load_model(request.param)


def test_gradient_policy_charges_its_backward_passes(lm):
    ids = torch.tensor(lm.encode("The cat sat")[:6])
    r = invert(lm, LayerTap(lm, 2).states(ids), 2, InvertConfig(policy="gradient", **FAST), progress=False,
               true_ids=[ids.tolist()])
    p = r.prompts[0]
    assert p.exact and p.backward_tokens > 0  # every descent step is one forward + backward of one token
    assert p.forward_tokens >= p.backward_tokens + sum(q.tried for q in p.positions)
    assert p.forward_equivalents == (p.forward_tokens + 2 * p.backward_tokens) / 6


def test_policies_only_order_the_same_verified_answer(lm):
    ids = torch.tensor(lm.encode("def f(x)")[:6])
    states = LayerTap(lm, 3).states(ids)
    tried = {}
    for policy in ("learned", "exhaustive", "random"):
        p = invert(lm, states, 3, InvertConfig(policy=policy, **FAST), progress=False, true_ids=[ids.tolist()]).prompts[0]
        assert p.exact and p.ids == ids.tolist()
        tried[policy] = sum(q.tried for q in p.positions)
    assert tried["learned"] < tried["exhaustive"]  # the calibrated ranking needs fewer candidates


def test_learned_reranking_fits_offset_and_gain_from_evaluated_candidates(lm):
    """Anchors u with exact states W h(u) = b + s·P_u: the fit recovers (b, s), so the token whose
    state is b + s·P_v ranks first; one anchor g is the plain shift r = W(ĥ − h(g)) + gain·P_g."""
    from sipit.invert.policies import make_policy

    fm = make_policy("learned", LayerTap(lm, 2), InvertConfig(**FAST)).model
    W, P = fm.c["white"].double(), fm.c["P"].double()
    g = torch.Generator().manual_seed(0)
    b, s, v = torch.randn(P.shape[1], generator=g, dtype=torch.float64), 0.37, 5
    u = torch.tensor([1, 2, 3, 7, 11, 13])
    unwhite = lambda y: torch.linalg.solve(W, y.T).T  # y [n, d] = h @ W with W symmetric  <=>  h = W^{-1} y
    states = unwhite(b + s * P[u]).float()
    target = torch.stack([states[0], unwhite((b + s * P[v])[None])[0].float()])  # position 1 holds token v
    y, gain = fm.residual(target, 1, (u, states))
    assert gain == pytest.approx(s, rel=1e-3)
    assert torch.allclose(y.double(), s * P[v], atol=1e-2 * float(P[v].norm()))
    assert int(fm.scores(target, 1, False, (u, states)).argmax()) == v
    y1, gain1 = fm.residual(target, 1, (u[:1], states[:1]))
    assert gain1 == fm.gain and 0 < fm.gain <= 1
    assert torch.allclose(y1, (target[1] - states[0]) @ fm.c["white"] + fm.gain * fm.c["P"][1], atol=1e-4)
