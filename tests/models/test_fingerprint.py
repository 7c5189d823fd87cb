"""Fingerprints of exactly what a cached quantity reads: the blocks below a tap, or the embedding only."""
import pytest
import torch

from sipit.models import LayerTap, ModelError, load_model, temporary_edit
from sipit.models.surfaces import KVTap, ProjectedTap, logits_tap


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-gpt2"])
def test_a_load_with_max_layer_has_the_whole_models_fingerprints_through_its_blocks(saved_tiny, spec):
    """Blocks 1..2 loaded: every fingerprint a tap at layer ≤ 2 uses is the whole model's (a cache filled
    by one is found by the other), the whole-model fingerprint is not (another model was loaded)."""
    _, d = saved_tiny(spec)
    whole, cut = load_model(d), load_model(d, max_layer=2)
    assert [whole.fingerprint_through(k) for k in range(3)] == [cut.fingerprint_through(k) for k in range(3)]
    assert len({whole.fingerprint_through(k) for k in range(5)}) == 5
    assert whole.embedding_fingerprint == cut.embedding_fingerprint
    assert whole.fingerprint == whole.fingerprint_through(4) and whole.fingerprint != cut.fingerprint
    with pytest.raises(ModelError, match="2 blocks loaded"):
        cut.fingerprint_through(3)


def test_editing_block_j_changes_the_fingerprints_through_more_than_j_blocks(saved_tiny):
    lm = load_model(saved_tiny("tiny-llama")[1])
    through = [lm.fingerprint_through(k) for k in range(lm.n_layers + 1)]
    embedding = lm.embedding_fingerprint
    for j in range(lm.n_layers):
        with temporary_edit(lm), torch.no_grad():
            next(lm.blocks[j].parameters())[0] += 1
            changed = [lm.fingerprint_through(k) != through[k] for k in range(lm.n_layers + 1)]
            assert changed == [k > j for k in range(lm.n_layers + 1)] and lm.embedding_fingerprint == embedding
    with temporary_edit(lm), torch.no_grad():  # outside the blocks: read by every tap
        lm.norm.weight[0] += 1
        assert all(lm.fingerprint_through(k) != through[k] for k in range(lm.n_layers + 1))
        assert lm.embedding_fingerprint == embedding
    with temporary_edit(lm), torch.no_grad():
        lm.embed.weight[3, 0] += 1
        assert lm.embedding_fingerprint != embedding
    assert [lm.fingerprint_through(k) for k in range(lm.n_layers + 1)] == through


def test_taps_say_how_many_blocks_they_read(tiny_lm):
    """Layer ℓ: blocks 0..ℓ-1 (block ℓ's KV cache is written inside 0-based block ℓ-1); logits: all of them."""
    assert [LayerTap(tiny_lm, layer).blocks_read for layer in (0, 2, -1)] == [0, 2, tiny_lm.n_layers]
    assert KVTap(tiny_lm, 2, "keys").blocks_read == 2
    assert ProjectedTap(tiny_lm, 1, torch.eye(tiny_lm.d_model)[:4]).blocks_read == 1
    assert logits_tap(tiny_lm).blocks_read == tiny_lm.n_layers


def test_equal_weights_under_another_config_are_another_model(small_decoder):
    """Two models of equal weights whose configs differ (RMSNorm's eps here, 1e-6 and 1e-5) compute other states: no
    fingerprint is shared, so neither reads the other's cached calibration or ε (the position-0 table of one
    excluded the other's true first tokens: every prompt failed); a config that differs only where a load with
    max_layer cuts it (the depth, per-layer lists past the blocks read, paths, versions) shares them."""
    import copy

    from sipit.invert import InvertConfig, invert
    from sipit.models.lm import LM

    lm = small_decoder("gemma4_text")  # (any: a config value the weights do not show)
    config = copy.deepcopy(lm.model.config)
    config.rms_norm_eps = 10 * lm.model.config.rms_norm_eps
    other = LM("other", type(lm.model)(config).eval(), None)
    other.model.load_state_dict(lm.model.state_dict())
    assert not {lm.fingerprint_through(k) for k in range(4)} & {other.fingerprint_through(k) for k in range(4)}
    renamed = LM("renamed", copy.deepcopy(lm.model), None)
    renamed.model.config._name_or_path, renamed.model.config.num_hidden_layers = "elsewhere", 7
    renamed.model.config.layer_types = lm.model.config.layer_types + ["full_attention"] * 4
    assert [renamed.fingerprint_through(k) for k in range(4)] == [lm.fingerprint_through(k) for k in range(4)]
    ids = torch.randint(0, lm.vocab_size, (3, 10), generator=torch.Generator().manual_seed(1))
    for model in (lm, other):
        r = invert(model, LayerTap(model, 3).states(ids), 3, InvertConfig(calibration_tokens=8192), progress=False,
                   true_ids=ids.tolist())
        assert [p.ids for p in r.prompts] == ids.tolist() and [p.status for p in r.prompts] == ["ok"] * 3
