"""The LM handle: temporary weight edits, named weights, fingerprints, models without a tokenizer."""
import pytest
import torch

from sipit.models import LayerTap, attention_weights, load_model, position_table, temporary_edit
from sipit.models.lm import cache_keyword


@pytest.mark.parametrize("spec", ["tiny-gpt2", "tiny-llama"])
def test_temporary_edit_restores_every_weight(spec):
    lm = load_model(spec)
    ids = torch.tensor([1, 2, 3, 4])
    before, fp = LayerTap(lm, -1).states(ids), lm.fingerprint
    with temporary_edit(lm):
        with torch.no_grad():
            for w in attention_weights(lm, 0)["qk"]:
                w.zero_()
        assert lm.fingerprint != fp  # the edit is a different model (a cache must not mix them)
        assert not torch.equal(LayerTap(lm, -1).states(ids), before)
    assert torch.equal(LayerTap(lm, -1).states(ids), before) and lm.fingerprint == fp


def test_position_table_only_for_learned_positions():
    assert position_table(load_model("tiny-gpt2")).shape == (512, 64)
    assert position_table(load_model("tiny-llama")) is None


def test_fingerprint_does_not_depend_on_the_thread_count():
    """A float sum's rounding depends on the summation order (the thread count): the fingerprint must not."""
    lm = load_model("tiny-llama")
    with torch.no_grad():  # a large weight of widely spread magnitudes, where reduction order shows
        g = torch.Generator().manual_seed(0)
        lm.blocks[0].mlp.up_proj.weight = torch.nn.Parameter(
            torch.randn(2048, 2048, generator=g) * torch.logspace(-6, 6, 2048)[:, None], requires_grad=False)
    threads = torch.get_num_threads()
    try:
        prints = set()
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            lm.forget_fingerprint()
            prints.add(lm.fingerprint)
    finally:
        torch.set_num_threads(threads)
    assert len(prints) == 1


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-gpt2"])
def test_new_cache_is_empty_and_independent_of_the_template(spec):
    """Copies of one template: a pass filling one leaves the next empty; layer types follow the config."""
    lm = load_model(spec)
    first = lm.new_cache()
    lm.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True, **{cache_keyword(lm.model): first})
    assert first.get_seq_length() == 3 and lm.new_cache().get_seq_length() == 0
    from transformers import DynamicCache

    assert [type(x) for x in lm.new_cache().layers] == [type(x) for x in DynamicCache(config=lm.model.config).layers]
    # a tap's cache holds the layers its blocks write, and its passes fill them as a whole cache's would
    tap, ids = LayerTap(lm, 1), torch.tensor([1, 2, 3, 4])
    assert len(lm.new_cache(1).layers) == 1 and len(tap.prefill(ids[:3]).cache.layers) == 1
    assert torch.allclose(tap.extend(tap.prefill(ids[:3]), ids[3:][None])[0], tap.states(ids)[3:], atol=1e-5)


def test_next_token_logprobs_from_a_layers_states_equal_those_from_the_ids(tiny_lm, tiny_gemma3):
    """The blocks above a layer run on its states (those below are skipped): the same log-probs as the whole model
    on the ids at every layer, the embedding's (0) and the last included, past Gemma-3's sliding window; the
    skipped blocks' own forward is back afterwards. A model loaded up to some layer gives None."""
    import copy

    for lm in (tiny_lm, tiny_gemma3):
        ids = torch.randint(0, lm.vocab_size, (13,), generator=torch.Generator().manual_seed(0))
        expected = lm.next_token_logprobs(ids)
        for layer in range(lm.depth + 1):
            got = lm.next_token_logprobs_from(layer, LayerTap(lm, layer).states(ids))
            assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-5), (lm.name, layer)
        assert not any("forward" in block.__dict__ for block in lm.blocks)
        assert torch.equal(lm.next_token_logprobs(ids), expected)
        truncated = copy.copy(lm)
        truncated.full_layers = lm.n_layers + 2
        assert truncated.next_token_logprobs_from(1, LayerTap(lm, 1).states(ids)) is None


def test_logits_with_a_cache_step_by_step_equal_the_full_forward(tiny_lm):
    """LM.logits(ids, cache) extends the cache: one token at a time gives the full forward's logits (the
    calibration's sampler, data.model_samples, relies on it)."""
    ids = torch.randint(0, tiny_lm.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    full = tiny_lm.logits(ids)
    cache = tiny_lm.new_cache()
    steps = torch.cat([tiny_lm.logits(ids[:, t:t + 1], cache) for t in range(6)], 1)
    assert torch.allclose(steps, full, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(tiny_lm.logits(ids[:, 5:], tiny_lm.new_cache()), full[:, 5:], atol=1e-5, rtol=1e-4)
