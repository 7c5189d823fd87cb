import copy

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


def test_prefix_lm_is_the_whole_models_prediction_and_only_for_text_like_prefixes(lm, cache):
    """_prefix_lm(ids) = log_softmax of the model's logits after ids (read off the prompt's observed states by
    the blocks above the tap, which also give the later positions' at no further cost); None for a prefix the LM
    finds less likely than chance (each token its least likely) and for a model loaded up to the tap's layer."""
    engine = SipIt(lm, 1, InvertConfig(learned=FAST))
    policy, cost = engine.policy, dict(forward_tokens=0, backward_tokens=0, tap_calls=0)
    likely, unlikely = [5], [5]
    for _ in range(6):
        likely.append(int(lm.next_token_logprobs(torch.tensor(likely))[-1].argmax()))
        unlikely.append(int(lm.next_token_logprobs(torch.tensor(unlikely))[-1].argmin()))
    policy.begin(LayerTap(lm, 1).states(torch.tensor(likely)), cost)
    with torch.no_grad():
        expected = torch.log_softmax(lm.model(input_ids=torch.tensor([likely])).logits[0].float(), -1)  # [7, V]
    assert torch.allclose(policy._prefix_lm(torch.tensor(likely[:3])), expected[2], atol=1e-5)  # all 7 run
    assert torch.allclose(policy._prefix_lm(torch.tensor(likely)), expected[-1], atol=1e-5)  # (kept: no run)
    assert cost["forward_tokens"] == 7 and cost["tap_calls"] == 1
    assert policy._prefix_lm(torch.tensor([5])) is not None  # one token: nothing to judge yet (an earlier row: runs)
    policy.begin(LayerTap(lm, 1).states(torch.tensor(unlikely)), cost)
    assert policy._prefix_lm(torch.tensor(unlikely)) is None
    assert cost["forward_tokens"] == 7 + 7 + 7 and cost["tap_calls"] == 3
    truncated = copy.copy(lm)
    truncated.full_layers = lm.n_layers + 2  # as load_model(..., max_layer=n_layers) of a deeper model
    assert truncated.next_token_logprobs(torch.tensor(likely)) is None


@pytest.mark.parametrize("last", [False, True])
def test_begin_many_gives_each_prompt_what_begin_gives_it_alone(lm, cache, last):
    """Lock-step inversion begins every prompt in one product per group: guesses, position-0 keys and
    bounds and the LM-prior switch of each prompt equal those of begin on that prompt alone
    (prompts of different lengths, text and random ids). At layer L the gate is moved between the
    prompts' scores (a random tiny LM finds no prompt likelier than chance) so the prior is on for
    some prompts and off for others."""
    layer = lm.n_layers if last else 1
    g = torch.Generator().manual_seed(5)
    prompts = [torch.tensor(lm.encode("The cat sat on the mat and looked at the dog.")[:n]) for n in (12, 7)]
    prompts += [torch.randint(0, lm.vocab_size, (n,), generator=g) for n in (9, 1, 5)]
    states = [LayerTap(lm, layer).states(p) for p in prompts]
    engine = SipIt(lm, layer, InvertConfig(learned=FAST))
    ranker = engine.policy.ranker
    if last:
        ranker.cal = copy.copy(ranker.cal)
        logps = [ranker.prior_screens(ranker.context_residuals(h), lm.norm(h[:-1]).float())[1] for h in states]
        scores = sorted(float(lp.mean()) for h, lp in zip(states, logps) if len(h) > 1)
        ranker.cal.lm_gate = (scores[1] + scores[2]) / 2
    cost = dict(forward_tokens=0, backward_tokens=0, tap_calls=0)
    together = engine.policy.begin_many(states, [dict(cost) for _ in states])
    for h, many in zip(states, together):
        alone = copy.copy(engine.policy)
        alone.begin(h, dict(cost))
        assert torch.equal(many.guess, alone.guess) and many.prior == alone.prior
        assert torch.allclose(many.d0, alone.d0) and torch.allclose(many.bounds0, alone.bounds0)
        assert torch.equal(many.target, h.float()) and many.anchors == {} and many is not engine.policy
    assert sum(p.prior for p in together) == (2 if last else 0)
