"""Surfaces as taps: observations equal what plain transformers computes, and invert exactly."""
import pytest
import torch

from sipit.invert import InvertConfig, invert
from sipit.models import ModelError
from sipit.models.lm import cache_keyword
from sipit.models import LayerTap
from sipit.models.surfaces import (KVTap, ProjectedTap, SortedTap, kv_observation, logits_error, logits_tap,
                                   normed_states_from_logits, random_projection)

EXHAUSTIVE = InvertConfig(policy="exhaustive")


def ids_of(lm, n=2, T=9, seed=0):
    return torch.randint(0, lm.vocab_size, (n, T), generator=torch.Generator().manual_seed(seed))


def assert_exact(lm, observations, tap, ids, error=0.0):
    config = InvertConfig(policy="exhaustive", observation_error=error)
    r = invert(lm, observations, tap.layer, config, tap=tap, progress=False, true_ids=ids.tolist())
    assert [p.ids for p in r.prompts] == ids.tolist() and all(p.exact for p in r.prompts)


@pytest.mark.parametrize("part", ["keys", "values", "both"])
def test_kv_tap_is_hf_cache_and_inverts(tiny_lm, part):
    ids = ids_of(tiny_lm)
    cache = tiny_lm.new_cache()  # HF's own full forward fills it
    tiny_lm.model(input_ids=ids, use_cache=True, **{cache_keyword(tiny_lm.model): cache})
    for layer in (1, tiny_lm.n_layers):
        tap = KVTap(tiny_lm, layer, part)
        hf = kv_observation(cache.layers[layer - 1].keys, cache.layers[layer - 1].values, part)
        assert hf.shape[-1] == tap.dim and tap.key == f"kv:{part}:L{layer}"
        assert torch.allclose(tap.states(ids), hf, atol=1e-5)
        assert_exact(tiny_lm, hf, tap, ids)


def test_kv_tap_extend_matches_full_forward(tiny_lm):
    ids = ids_of(tiny_lm, 1, 7)[0]
    tap = KVTap(tiny_lm, 2, "keys")
    full = tap.states(ids[None])[0]
    prefix = tap.prefill(ids[:4])
    ext, grown = tap.extend(prefix, ids[None, 4:], keep=True)
    assert torch.allclose(ext[0], full[4:], atol=1e-5)
    assert torch.allclose(tap.extend(grown(0, 2), ids[6:7]), full[6:7], atol=1e-5)


def test_kv_layer_zero_and_bad_part(tiny_lm):
    with pytest.raises(ModelError, match="layer ℓ ≥ 1"):
        KVTap(tiny_lm, 0)
    with pytest.raises(ModelError, match="KV part"):
        KVTap(tiny_lm, 1, "queries")


@pytest.mark.parametrize("kind", ["gaussian", "coords", "pca"])
def test_projection_inverts_and_wrong_projection_fails(tiny_lm, kind):
    ids = ids_of(tiny_lm)
    states = LayerTap(tiny_lm, 2).states(ids)
    P = random_projection(tiny_lm.d_model, 16, kind, seed=1, states=states)
    tap = ProjectedTap(tiny_lm, 2, P)
    assert tap.dim == 16 and tap.key.startswith("projection:16x")
    assert_exact(tiny_lm, states @ P.T, tap, ids)
    wrong = ProjectedTap(tiny_lm, 2, random_projection(tiny_lm.d_model, 16, "gaussian", seed=2))
    r = invert(tiny_lm, states @ P.T, 2, EXHAUSTIVE, tap=wrong, progress=False)
    assert all(p.status == "failed" for p in r.prompts)


def test_projection_shape_checked(tiny_lm):
    with pytest.raises(ModelError, match="projection must be"):
        ProjectedTap(tiny_lm, 1, torch.randn(4, tiny_lm.d_model + 1))


def test_permuted_states_invert_through_sorting(tiny_lm):
    """States whose hidden dimensions went through an unknown permutation: compared sorted, they
    invert exactly without π; a wrong layer still fails."""
    ids = ids_of(tiny_lm)
    states = LayerTap(tiny_lm, 2).states(ids)
    permuted = states[..., torch.randperm(tiny_lm.d_model, generator=torch.Generator().manual_seed(7))]
    tap = SortedTap(tiny_lm, 2)
    assert tap.key == "sorted:L2" and torch.equal(tap.states(ids), permuted.sort(-1).values)
    assert_exact(tiny_lm, permuted.sort(-1).values, tap, ids)
    r = invert(tiny_lm, permuted.sort(-1).values, 3, EXHAUSTIVE, tap=SortedTap(tiny_lm, 3), progress=False)
    assert all(p.status == "failed" for p in r.prompts)


@pytest.mark.parametrize("logprobs", [False, True])
def test_logits_recover_normed_states_and_invert(tiny_lm, logprobs):
    ids = ids_of(tiny_lm)
    out = tiny_lm.model(input_ids=ids, output_hidden_states=True)
    z = torch.log_softmax(out.logits, -1) if logprobs else out.logits
    x = torch.stack([normed_states_from_logits(tiny_lm, zi, logprobs) for zi in z])
    assert torch.allclose(x, out.hidden_states[-1], atol=1e-4)  # HF's last entry is after the final norm
    assert_exact(tiny_lm, x, logits_tap(tiny_lm), ids, logits_error(tiny_lm, 2.0 ** -24))


def test_logits_soft_cap_and_truncated_vocabulary(tiny_lm, monkeypatch):
    ids = ids_of(tiny_lm, 1)
    out = tiny_lm.model(input_ids=ids, output_hidden_states=True)
    monkeypatch.setattr(tiny_lm.model.config, "final_logit_softcapping", 30.0, raising=False)
    capped = 30.0 * torch.tanh(out.logits[0] / 30.0)  # what Gemma-2/3's forward returns
    assert torch.allclose(normed_states_from_logits(tiny_lm, capped), out.hidden_states[-1][0], atol=1e-4)
    with pytest.raises(ModelError, match="truncated vocabulary or top-k"):
        normed_states_from_logits(tiny_lm, out.logits[0, :, :100])
    with pytest.raises(ModelError, match="saturated"):
        normed_states_from_logits(tiny_lm, torch.full_like(capped, 30.0))


def test_one_pass_observes_every_tap_as_it_does_alone(tiny_lm):
    """run_taps (the shared calibration pass): states, final-normed states, a projection and KV caches
    at several layers from one forward equal each tap's own forward."""
    from sipit.models.tap import run_taps

    P = random_projection(tiny_lm.d_model, 8, seed=3)
    taps = [LayerTap(tiny_lm, 2), LayerTap(tiny_lm, 4, final_norm=True), ProjectedTap(tiny_lm, 1, P),
            KVTap(tiny_lm, 3, "keys"), KVTap(tiny_lm, 1, "both")]
    ids = ids_of(tiny_lm, n=3, T=7)
    for tap, got in zip(taps, run_taps(tiny_lm, taps, ids)):
        assert torch.allclose(got, tap.states(ids), rtol=1e-5, atol=1e-6), tap


def test_logits_need_the_last_block_loaded():
    """A load cut below the last block has no logits: the logits tap says so instead of reading the
    last *loaded* block as if the LM head read it."""
    import pytest

    from sipit.models import ModelError, load_model

    lm = load_model("random:gpt2", max_layer=2)
    with pytest.raises(ModelError, match="not loaded"):
        logits_tap(lm)
    assert logits_tap(load_model("random:gpt2", max_layer=12)).layer == 12


def test_permutation_recovered_from_first_positions(tiny_lm):
    """Several prompts' first positions pin π: unpermuting gives the states back exactly."""
    from sipit.models.surfaces import recover_permutation

    ids = ids_of(tiny_lm, n=6, T=5, seed=4)
    states = LayerTap(tiny_lm, 2).states(ids)
    perm = torch.randperm(tiny_lm.d_model, generator=torch.Generator().manual_seed(5))
    got = recover_permutation(LayerTap(tiny_lm, 2), list(states[..., perm]))
    assert got is not None and torch.equal(got, perm)
