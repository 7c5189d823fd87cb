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


def test_blocks_wider_than_the_embedding(small_decoder):
    """OPT-350m's layout (conftest.LAYOUTS): 24-wide embedding, 32-wide post-LN blocks, no final norm, project_out
    after the last block. Every layer's states are the model's own hidden_states, the last one with the final norm
    (project_out: 24 wide, what the LM head reads); the logits give those back; the log-probs read off the last
    layer's states are the model's (the LM failed to load: no final norm)."""
    from sipit.models.surfaces import normed_states_from_logits

    lm = small_decoder("opt-350m")
    ids = torch.randint(0, lm.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    out = lm.model(ids, output_hidden_states=True)
    assert lm.d_model == 32 and lm.embedding_rows().shape == (lm.vocab_size, 24)
    for layer in range(lm.depth):
        assert torch.equal(LayerTap(lm, layer).states(ids), out.hidden_states[layer])
    last = LayerTap(lm, lm.depth, final_norm=True)
    assert last.dim == 24 and torch.allclose(last.states(ids), out.hidden_states[-1], atol=1e-6)
    assert torch.allclose(normed_states_from_logits(lm, out.logits[0]), out.hidden_states[-1][0], atol=1e-4)
    from_states = lm.next_token_logprobs_from(lm.depth, LayerTap(lm, lm.depth).states(ids[0]))
    assert torch.allclose(from_states, lm.next_token_logprobs(ids[0]), atol=1e-5)


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


@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-llama", "tiny_gemma3"])
def test_logits_with_a_cache_step_by_step_equal_the_full_forward(model, request):
    """LM.logits(ids, cache) extends the cache: one token at a time gives the full forward's logits (the
    calibration's sampler, data.model_samples, relies on it), also past Gemma-3's sliding window (8 here)."""
    lm = request.getfixturevalue(model) if model == "tiny_gemma3" else load_model(model)
    ids = torch.randint(0, lm.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    full = lm.logits(ids)
    cache = lm.new_cache()
    steps = torch.cat([lm.logits(ids[:, t:t + 1], cache) for t in range(12)], 1)
    assert torch.allclose(steps, full, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(lm.logits(ids[:, 11:], lm.new_cache()), full[:, 11:], atol=1e-5, rtol=1e-4)


ONE_KEY_ARCHS = {"llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "gemma": {}, "gemma2": {},
                 "gemma3_text": {"sliding_window": 4}}


def _small(model_type: str):
    """A 2-block random decoder of model_type (4 query heads on 2 key-value heads, so heads are shared)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from sipit.models.lm import LM

    config = AutoConfig.for_model(model_type, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  **ONE_KEY_ARCHS[model_type])
    torch.manual_seed(0)
    return LM(model_type, AutoModelForCausalLM.from_config(config).eval(), None)


@pytest.mark.parametrize("model_type", [*ONE_KEY_ARCHS, "gpt2"])
def test_one_token_sequences_skip_query_and_key_with_the_same_states(model_type, monkeypatch):
    """Every token its own prompt (the position-0 table): run_layers skips attention's query products on the
    architectures of ONE_KEY_ATTENTION, giving the same states bit for bit as the modules' own forward; GPT-2 (one
    fused projection) runs as it is. A KV edit's cache handed in still goes through the module's own forward."""
    from sipit.models import lm as lm_module
    from sipit.models.edit import edit_kv
    from sipit.models.tap import run_layers

    lm = load_model("tiny-gpt2") if model_type == "gpt2" else _small(model_type)
    ids = torch.arange(lm.vocab_size)[:, None]  # [V, 1]
    layers = list(range(lm.n_layers + 1))
    calls = []
    for block in lm.blocks:
        query = block.attn.c_attn if model_type == "gpt2" else block.self_attn.q_proj
        query.register_forward_hook(lambda *_: calls.append(1))
    fast = run_layers(lm, layers, ids=ids)
    skipped = len(calls) == 0
    monkeypatch.setattr(lm_module, "ONE_KEY_ATTENTION", set())  # every module's own forward
    slow = run_layers(lm, layers, ids=ids)
    monkeypatch.undo()
    assert skipped == (model_type != "gpt2") and len(calls) > 0
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert not any("forward" in getattr(block, "self_attn", block).__dict__ for block in lm.blocks)  # restored
    with edit_kv(lm, 1, lambda k, v: (k, v * 2)):
        assert not torch.equal(run_layers(lm, [1], ids=ids)[0], fast[1])


def test_recurrent_blocks_not_checked_are_a_clear_error():
    """RecurrentGemma's passes on its cache do not reproduce its full forward (measured ε 14: every prompt would be
    `ambiguous`): inverting a model type with recurrent blocks that decoders.py did not check is a ModelError saying
    so, while its states are still captured by a plain forward."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from sipit.invert import invert
    from sipit.models import ModelError
    from sipit.models.lm import LM

    config = AutoConfig.for_model("recurrent_gemma", vocab_size=96, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    lm = LM("recurrent_gemma", AutoModelForCausalLM.from_config(config).eval(), None)
    ids = torch.randint(0, lm.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = lm.model(ids, output_hidden_states=True).hidden_states
    states = LayerTap(lm, 2).states(ids)
    assert torch.allclose(states, hidden[2], atol=1e-6)
    with pytest.raises(ModelError, match="recurrent_gemma blocks keep a recurrent state, and passes on their cache "
                                         "were not checked"):
        invert(lm, states, 2, progress=False)
