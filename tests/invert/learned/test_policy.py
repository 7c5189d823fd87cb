import pytest
import torch

from sipit.invert import InvertConfig, SipIt
from sipit.models import LayerTap

from .conftest import FAST, SAMPLED


@pytest.mark.parametrize("last", [False, True])
def test_fast_calibration_inverts_as_the_default_does(lm, cache, last):
    """Layers 1 and L, text and random ids: every prompt exact with the same status in both modes; fast
    mode has no position-0 bounds (the table gives the default mode certified ones)."""
    layer = lm.n_layers if last else 1
    g = torch.Generator().manual_seed(4)
    prompts = [torch.tensor(lm.encode("The cat sat on the mat and looked at the dog.")[:12])]
    prompts += [torch.randint(0, lm.vocab_size, (12,), generator=g) for _ in range(3)]
    states = [LayerTap(lm, layer).states(p) for p in prompts]
    results = {}
    for name, learned in (("full", FAST), ("fast", SAMPLED)):
        engine = SipIt(lm, layer, InvertConfig(learned=learned))
        results[name] = [engine.invert_prompt(h, p.tolist()) for h, p in zip(states, prompts)]
        engine.policy.begin(states[0], dict(forward_tokens=0, backward_tokens=0, tap_calls=0))
        assert (engine.policy.lower_bounds(0) is None) == (name == "fast")
        assert engine.policy.lower_bounds(1) is None
    assert all(r.exact for rs in results.values() for r in rs)
    assert [r.status for r in results["fast"]] == [r.status for r in results["full"]]
    assert {r.status for r in results["fast"]} <= {"ok", "ambiguous"}
