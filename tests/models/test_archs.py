"""random:<arch>: the paper's architectures at init, built offline, no tokenizer."""
import pytest
import torch

from sipit.models import LayerTap, ModelError, load_model
from sipit.models.archs import ARCHS, parse_random_spec, random_model

# (layers, d_model, vocab) of each published config
SHAPES = {"gpt2": (12, 768, 50257), "tinystories-33m": (4, 768, 50257), "llama-3.1-8b": (32, 4096, 128256),
          "mistral-7b": (32, 4096, 32000), "phi-4-mini": (32, 3072, 200064), "gemma-3-1b": (26, 1152, 262144),
          "qwen2.5-7b": (28, 3584, 152064), "opt-350m": (24, 1024, 50272)}


def test_spec_parsing():
    assert parse_random_spec("random:gpt2") == ("gpt2", 0)
    assert parse_random_spec("random:mistral-7b:seed=7") == ("mistral-7b", 7)
    for bad in ("random:", "random:gpt3", "random:gpt2:7", "random:gpt2:seed=x"):
        with pytest.raises(ModelError):
            parse_random_spec(bad)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_architecture_builds_with_its_published_shape(arch):
    """Built on the meta device (no memory, no draws): blocks, norm and embedding are found, the
    shapes are the published ones, and max_layer keeps only the first blocks."""
    lm = random_model(f"random:{arch}", dtype=torch.bfloat16, device=torch.device("meta"), max_layer=2)
    layers, d, vocab = SHAPES[arch]
    assert (lm.n_layers, lm.full_layers, lm.d_model, lm.vocab_size) == (2, layers, d, vocab)
    assert lm.dtype == torch.bfloat16 and lm.device.type == "meta" and lm.tokenizer is None
    assert lm.layer_index(-layers - 1) == 0  # negative layers count from the architecture's last block
    with pytest.raises(ModelError, match="max_layer=2"):
        lm.layer_index(3)


def test_random_gpt2_has_no_tokenizer_and_inverts_at_layer_1():
    """GPT-2 small at init, only block 1 loaded: ids in, ids out, and SipIt (exhaustive policy)
    recovers a prompt exactly (small ids: the exhaustive order tries ids 0, 1, 2, ... first)."""
    from sipit.invert import InvertConfig, invert

    lm = load_model("random:gpt2", max_layer=1)
    assert lm.name == "random:gpt2:seed=0" and (lm.n_layers, lm.full_layers) == (1, 12)
    with pytest.raises(ModelError, match="no tokenizer"):
        lm.encode("hello")
    assert lm.decode([3, 14]).startswith("[id 3, id 14]")
    ids = torch.tensor([5, 17, 3, 9])
    states = LayerTap(lm, 1).states(ids)
    res = invert(lm, states, 1, InvertConfig(policy="exhaustive"), progress=False)
    assert res.prompts[0].ids == ids.tolist()


def test_truncated_random_model_is_the_full_model_cut():
    """Each module is drawn from its own seed: blocks 1..max_layer are the full model's, bit for bit;
    another seed draws other weights."""
    full = load_model("random:tinystories-33m")
    cut = load_model("random:tinystories-33m", max_layer=2)
    assert (full.n_layers, cut.n_layers) == (4, 2)
    ids = torch.tensor([[1, 50000, 7, 300, 12]])
    assert torch.equal(LayerTap(full, 2).states(ids), LayerTap(cut, 2).states(ids))
    other = load_model("random:tinystories-33m:seed=1", max_layer=2)
    assert not torch.equal(other.embed.weight, cut.embed.weight)
    assert other.fingerprint != cut.fingerprint
