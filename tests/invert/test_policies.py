"""Candidate policies: what they rank and what they charge to the loop's cost counter."""
import pytest
import torch

from sipit.invert import GradientConfig, InvertConfig, invert
from sipit.models import LayerTap, load_model

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


def test_the_engine_tells_its_policy_the_acceptance_threshold(lm):
    """A policy may treat what lies within the loop's eps as a match (the learned one's kept first tokens): the engine
    sets it, whatever the policy."""
    from sipit.invert import SipIt

    for name in ("exhaustive", "random"):
        assert SipIt(lm, 2, InvertConfig(policy=name), eps=3e-4).policy.eps == 3e-4
