"""The audit's surfaces: what leaks, its defence, and the tap observation SipIt compares it through."""
import pytest
import torch

from sipit.audit.defenses import Defense, quantize_rows
from sipit.audit.surfaces import check_defenses, make_surface, parse_surface
from sipit.io import SipitError
from sipit.models import load_model

SURFACES = ["states", "kv:keys", "kv:values", "kv", "logits", "projection:8", "projection:8:pca",
            "projection:12:coords"]
IDS = [[5, 17, 99, 3, 200, 41, 7], [250, 1, 64, 64, 9, 120, 33]]


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama")


def surface(lm, text, layer=2):
    layer = lm.n_layers if text == "logits" else layer
    return make_surface(lm, parse_surface(lm, text, [layer]), layer, IDS)


@pytest.mark.parametrize("text", SURFACES)
def test_leak_is_what_the_tap_observes(lm, text):
    s = surface(lm, text)
    for ids in IDS:
        leaked = s.leak(ids)
        obs = s.tap.states(torch.tensor(ids))
        assert obs.shape == (len(ids), s.tap.dim)
        assert torch.allclose(s.observe(leaked), obs, atol=1e-4 * float(obs.abs().max()))
    assert s.leak(IDS[0]).shape[-1] == {"logits": lm.vocab_size}.get(text, s.tap.dim)


def test_logits_observation_keeps_logit_distances_and_bounds(lm):
    s = surface(lm, "logits")
    z1, z2 = s.leak(IDS[0]).double(), s.leak(IDS[1]).double()
    y1, y2 = s.observe(z1).double(), s.observe(z2).double()
    assert torch.allclose((y1 - y2).norm(dim=-1), (z1 - z2).norm(dim=-1), rtol=1e-5)
    stored = quantize_rows(z1.float(), "int4")
    err = (s.observe(stored).double() - y1).norm(dim=-1) / s.observe(stored).double().norm(dim=-1)
    assert (err > 0).all() and (err <= s.error_bound(stored, "int4")).all()
    noisy = s.noise(y1[None], 0.5, torch.Generator().manual_seed(0))[0]  # noise on the V logits, seen through Qᵀ
    shift = (noisy - y1).norm(dim=-1) / z1.norm(dim=-1)
    assert (shift < 0.5).all() and (shift > 0.1).all()  # d/V = 1/4 of the energy: about 0.5·sqrt(1/4)


def test_kv_both_defends_keys_and_values_separately(lm):
    s = surface(lm, "kv")
    leaked = s.leak(IDS[0])
    noisy = s.defend(Defense("noise", 0.1), leaked)
    for part, got in zip(leaked.chunk(2, -1), noisy.chunk(2, -1)):
        rel = (got - part).norm(dim=-1) / part.norm(dim=-1)
        assert torch.allclose(rel, torch.full_like(rel, 0.1), atol=1e-4)
    y = leaked.double()[None]
    noisy = s.noise(y, 0.1, torch.Generator().manual_seed(0))  # robust.py's noise: per part too
    for part, got in zip(y.chunk(2, -1), noisy.chunk(2, -1)):
        rel = (got - part).norm(dim=-1) / part.norm(dim=-1)
        assert torch.allclose(rel, torch.full_like(rel, 0.1), atol=1e-6)
    rel = (noisy - y).norm(dim=-1) / y.norm(dim=-1)  # so the whole row moves by σ‖row‖: the radius' scale
    assert torch.allclose(rel, torch.full_like(rel, 0.1), atol=1e-6)


@pytest.mark.parametrize("text, layers, message", [
    ("attention", [2], "unknown surface"), ("kv:queries", [2], "bad --surface 'kv:queries'"),
    ("projection:65", [2], "exceeds the model's d_model=64"), ("projection:8:sparse", [2], "bad --surface"),
    ("kv", [0, 2], "no layer 0"), ("logits", [2], "last layer only"), ("logprobs", [4], "unknown surface"),
])
def test_bad_surfaces(lm, text, layers, message):
    with pytest.raises(SipitError, match=message):
        parse_surface(lm, text, layers)


def test_defences_that_do_not_apply_to_a_surface(lm, monkeypatch):
    with pytest.raises(SipitError, match="applies to --surface states only"):
        check_defenses(lm, parse_surface(lm, "projection:8", [2]), [Defense("project", 4)])
    logits = parse_surface(lm, "logits", [lm.n_layers])
    check_defenses(lm, logits, [Defense("none"), Defense("noise", 0.1)])
    monkeypatch.setattr(lm.model.config, "final_logit_softcapping", 30.0, raising=False)  # Gemma-2/3
    check_defenses(lm, logits, [Defense("none")])
    with pytest.raises(SipitError, match="soft-caps its logits"):
        check_defenses(lm, logits, [Defense("none"), Defense("quant", "int8")])


def test_sae_latents_are_observed_through_the_reconstruction_and_bounded(lm, tmp_path, random_sae):
    """The SAE surface leaks latents [T, n]; observed, they are the tap's reconstruction, and a storage format's
    rounding of them moves the reconstruction by no more than error_bound says (through σ_max(W_dec))."""
    s = make_surface(lm, parse_surface(lm, f"sae:{random_sae(lm.d_model, 'topk').save(tmp_path / 'sae')}", [2]), 2, IDS)
    leaked = s.leak(IDS[0])
    obs = s.tap.states(torch.tensor(IDS[0]))
    assert leaked.shape == (len(IDS[0]), 4 * lm.d_model) and ((leaked > 0).sum(-1) <= 6).all()
    assert torch.allclose(s.observe(leaked), obs, atol=1e-5 * float(obs.abs().max()))
    for fmt in ("int4", "fp8"):
        stored = quantize_rows(leaked, fmt)
        y, y_stored = s.observe(leaked).double(), s.observe(stored).double()
        err = (y_stored - y).norm(dim=-1) / y_stored.norm(dim=-1)
        assert (err > 0).all() and (err <= s.error_bound(stored, fmt)).all()
