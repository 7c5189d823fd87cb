import torch

from sipit.models import LayerTap
from sipit.models.edit import edit_layer
from sipit.models.lm import cache_keyword


def test_edit_layer_replaces_the_state_and_is_removed(tiny_lm):
    ids = torch.tensor([[5, 17, 99, 3, 200]])
    clean = tiny_lm.logits(ids)
    for layer in (0, 2, tiny_lm.n_layers):
        with edit_layer(tiny_lm, layer, lambda h: h):  # identity edit: nothing changes
            assert torch.allclose(tiny_lm.logits(ids), clean, atol=1e-5)
        seen = []
        with edit_layer(tiny_lm, layer, lambda h: seen.append(h.clone()) or h * 0):
            edited = tiny_lm.logits(ids)
        assert torch.allclose(seen[0], LayerTap(tiny_lm, layer).states(ids), atol=1e-5)  # the tap's layer
        assert not torch.allclose(edited, clean, atol=1e-3)
        assert torch.equal(tiny_lm.logits(ids), clean)  # hook gone


def test_edit_kv_sees_the_cache_and_changes_what_attention_reads(tiny_lm):
    from sipit.models.edit import edit_kv
    from sipit.models.surfaces import KVTap

    ids = torch.tensor([[5, 17, 99, 3, 200]])
    clean = tiny_lm.logits(ids)
    layer = 2
    with edit_kv(tiny_lm, layer, lambda k, v: (k, v)):  # identity edit: nothing changes
        assert torch.allclose(tiny_lm.logits(ids), clean, atol=1e-5)
    seen = []
    with edit_kv(tiny_lm, layer, lambda k, v: seen.append((k.clone(), v.clone())) or (k, v * 0)):
        stored = tiny_lm.new_cache()
        edited = tiny_lm.model(input_ids=ids, use_cache=True, **{cache_keyword(tiny_lm.model): stored})
    keys, values = KVTap(tiny_lm, layer).cache_of(ids)
    assert torch.allclose(seen[0][0], keys, atol=1e-5) and torch.allclose(seen[0][1], values, atol=1e-5)
    assert torch.equal(stored.layers[layer - 1].values, torch.zeros_like(values))  # what is stored
    assert not torch.allclose(edited.logits, clean, atol=1e-3)
    assert torch.equal(tiny_lm.logits(ids), clean)  # hook gone
