"""SAEs as SAELens and sparsify save them (models/sae.py) and their latents as a leak surface (surfaces.SAETap)."""
import json

import pytest
import torch

from sipit.invert import InvertConfig, invert
from sipit.models import LayerTap
from sipit.models.sae import SAEError, hook_layer, load_sae, sae_layer
from sipit.models.surfaces import SAETap


@pytest.mark.parametrize("architecture", ["standard", "topk", "jumprelu", "gated"])
def test_each_architecture_round_trips_through_a_saelens_directory(random_sae, tmp_path, architecture):
    """What SAE.save writes (SAELens 6's files) loads back to the same latents; TopK keeps at most k, JumpReLU none
    at or below its threshold. (docs/results/surfaces/saelens_check.py: SAELens' own save_model and encode/decode
    against this reader, equal to the last bit.)"""
    sae = random_sae(16, architecture)
    loaded = load_sae(sae.save(tmp_path / architecture))
    x = torch.randn(3, 5, 16)
    f = loaded.encode(x)
    assert torch.equal(f, sae.encode(x)) and loaded.digest == sae.digest and loaded.layer == 2
    assert torch.allclose(loaded.decode(f), f @ sae.W_dec + sae.b_dec)
    assert f.shape == (3, 5, 64) and (f >= 0).all()
    if architecture == "topk":
        assert ((f > 0).sum(-1) <= 6).all()
    if architecture == "jumprelu":
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
        assert (f[pre <= sae.threshold] == 0).all() and torch.equal(f[pre > sae.threshold], pre[pre > sae.threshold])


def test_hook_names_and_older_saelens_configs(random_sae, tmp_path):
    """TransformerLens' hook names (resid_pre = layer i, resid_post = i + 1) and a Hugging Face block's output name the
    layer; SAELens before 6 saved a TopK SAE as a standard one with activation_fn_str "topk" and its k in
    activation_fn_kwargs, and the hook as hook_point."""
    assert [hook_layer(h) for h in ("blocks.0.hook_resid_pre", "blocks.7.hook_resid_post", "model.layers.3",
                                    "layers.11", "blocks.3.hook_mlp_out")] == [0, 8, 4, 12, None]
    path = random_sae(16, "topk").save(tmp_path / "old")
    cfg = json.loads((path / "cfg.json").read_text())
    cfg = dict(d_in=16, d_sae=64, architecture="standard", activation_fn_str="topk", activation_fn_kwargs={"k": 6},
               hook_point="blocks.2.hook_resid_pre", apply_b_dec_to_input=cfg["apply_b_dec_to_input"])
    (path / "cfg.json").write_text(json.dumps(cfg))
    sae = load_sae(path)
    assert (sae.architecture, sae.k, sae.layer) == ("topk", 6, 2) and sae_layer(path) == 2  # (from cfg.json alone)


def test_sae_directories_sipit_cannot_use_are_one_clear_error(random_sae, tmp_path):
    from safetensors.torch import load_file, save_file

    with pytest.raises(SAEError, match="not an SAE directory"):
        load_sae(tmp_path / "missing")
    cases = {"architecture": ("matryoshka_batchtopk", "not supported"),
             "normalize_activations": ("expected_average_only_in", "normalize_activations"),
             "reshape_activations": ("hook_z", "attention heads"), "k": (None, "needs an integer k")}
    for key, (value, message) in cases.items():
        path = random_sae(16, "topk").save(tmp_path / key)
        cfg = json.loads((path / "cfg.json").read_text())
        (path / "cfg.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(SAEError, match=message):
            load_sae(path)
    path = random_sae(16, "jumprelu").save(tmp_path / "no-threshold")
    weights = load_file(path / "sae_weights.safetensors")
    save_file({k: v for k, v in weights.items() if k != "threshold"}, path / "sae_weights.safetensors")
    with pytest.raises(SAEError, match="lacks threshold"):
        load_sae(path)
    save_file({**weights, "W_dec": weights["W_dec"][:, :-1].contiguous()}, path / "sae_weights.safetensors")
    with pytest.raises(SAEError, match="do not fit"):
        load_sae(path)
    (path / "cfg.json").write_text("{not json")
    with pytest.raises(SAEError, match="unreadable"):
        load_sae(path)


@pytest.mark.parametrize("architecture", ["standard", "topk", "gated"])
def test_sae_latents_invert_exactly_through_their_reconstruction(random_sae, tiny_lm, architecture):
    """The tap observes decode(encode(h)) of the full forward's states; the latents' reconstructions invert exactly,
    through another SAE's tap they fail, and latents that are all zero (a JumpReLU whose thresholds nothing reaches)
    hold nothing of the prompt: every token matches, and the result says so (ambiguous), not a guess."""
    ids = torch.randint(0, tiny_lm.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    sae = random_sae(tiny_lm.d_model, architecture)
    tap = SAETap(tiny_lm, 2, sae)
    latents = sae.encode(LayerTap(tiny_lm, 2).states(ids))
    assert tap.dim == tiny_lm.d_model and tap.key.startswith(f"sae:{sae.n}:{sae.digest}:L2")
    assert torch.allclose(tap.states(ids), sae.decode(latents), atol=1e-6)
    r = invert(tiny_lm, sae.decode(latents), 2, tap=tap, progress=False, true_ids=ids.tolist())
    assert all(p.exact and p.status == "ok" for p in r.prompts)
    other = SAETap(tiny_lm, 2, random_sae(tiny_lm.d_model, architecture, seed=1))
    r = invert(tiny_lm, sae.decode(latents), 2, InvertConfig(policy="exhaustive"), tap=other, progress=False)
    assert all(p.status == "failed" for p in r.prompts)
    closed = random_sae(tiny_lm.d_model, "jumprelu", threshold=torch.full((4 * tiny_lm.d_model,), 1e9))
    r = invert(tiny_lm, closed.decode(closed.encode(LayerTap(tiny_lm, 2).states(ids))), 2,
               InvertConfig(policy="exhaustive"), tap=SAETap(tiny_lm, 2, closed), progress=False)
    assert all(p.status == "ambiguous" for p in r.prompts)


def test_an_sae_of_transformer_lens_centred_stream_reads_centred_states(tmp_path, tiny_lm, random_sae):
    """SAELens' GPT-2 residual SAEs read TransformerLens' stream with center_writing_weights (their config says so):
    on a model of LayerNorm blocks (GPT-2) the tap centres the states before encoding, and their latents invert; on
    RMSNorm blocks (Llama), and for an SAE whose config does not say so, nothing is centred."""
    sae = load_sae(random_sae(tiny_lm.d_model, "topk", centred_on_layernorm=True).save(tmp_path / "centred"))
    plain = load_sae(random_sae(tiny_lm.d_model, "topk").save(tmp_path / "plain"))
    assert sae.centred_on_layernorm and not plain.centred_on_layernorm and sae.digest != plain.digest
    layernorm = "gpt2" in tiny_lm.name
    tap = SAETap(tiny_lm, 2, sae)
    assert tap.centre == layernorm and not SAETap(tiny_lm, 2, plain).centre
    ids = torch.randint(0, tiny_lm.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    h = LayerTap(tiny_lm, 2).states(ids)
    latents = sae.encode(h - h.mean(-1, keepdim=True) if layernorm else h)
    assert torch.equal(tap.latents(h), latents)
    r = invert(tiny_lm, sae.decode(latents), 2, tap=tap, progress=False, true_ids=ids.tolist())
    assert all(p.exact and p.status == "ok" for p in r.prompts)


@pytest.mark.parametrize("activation", ["topk", "groupmax"])
def test_a_sparsify_directory_loads_with_its_hookpoint_layer(tmp_path, activation):
    """EleutherAI's sparsify saves cfg.json and sae.safetensors (encoder.weight [n, d], encoder.bias, W_dec, b_dec) in a
    directory named after the hookpoint (layers.i: a Hugging Face block's output, layer i + 1): latents relu(encoder(h −
    b_dec)), the top k or the largest of each of k groups; a transcoder is refused. (docs/results/surfaces/
    sparsify_check.py: sparsify's own save_to_disk and encode against this reader.)"""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    d, n, k = 16, 64, 4
    weights = {"encoder.weight": torch.randn(n, d, generator=g), "encoder.bias": torch.randn(n, generator=g),
               "W_dec": torch.randn(n, d, generator=g), "b_dec": torch.randn(d, generator=g)}
    path = tmp_path / "layers.3"
    path.mkdir()
    save_file(weights, path / "sae.safetensors")
    (path / "cfg.json").write_text(json.dumps(dict(d_in=d, k=k, activation=activation, num_latents=n,
                                                   expansion_factor=4, normalize_decoder=True)))
    sae = load_sae(path)
    assert (sae.architecture, sae.layer, sae.k, sae.n) == (activation, 4, k, n) and sae_layer(path) == 4
    x = torch.randn(7, d, generator=g)
    pre = torch.relu((x - weights["b_dec"]) @ weights["encoder.weight"].T + weights["encoder.bias"])
    if activation == "topk":
        values, indices = pre.topk(k)
    else:
        best = pre.unflatten(-1, (k, -1)).max(-1)
        values, indices = best.values, best.indices + torch.arange(0, n, n // k)
    latents = torch.zeros(7, n).scatter_(1, indices, values)
    assert torch.equal(sae.encode(x), latents)
    assert torch.allclose(sae.decode(latents), latents @ weights["W_dec"] + weights["b_dec"])
    (path / "cfg.json").write_text(json.dumps(dict(d_in=d, k=k, transcode=True)))
    with pytest.raises(SAEError, match="transcoder"):
        load_sae(path)


@pytest.mark.parametrize("architecture", ["standard", "topk", "jumprelu"])
def test_a_stored_rounding_of_latents_moves_the_reconstruction_within_its_bound(random_sae, architecture):
    """reconstruction_error bounds ‖decode(f) − decode(f̃)‖ (relative to ‖decode(f̃)‖) for latents f rounded to f̃ within an elementwise bound,
    latents rounded to zero included (a small one under a coarse int4 step), and needs no full-decoder SVD."""
    from sipit.audit.defenses import quant_elementwise_bound, quantize_rows

    sae = random_sae(16, architecture)
    f = sae.encode(torch.randn(50, 16, generator=torch.Generator().manual_seed(3)) * 3)
    active = (f > 0).nonzero()
    f[active[0, 0], active[0, 1]] = 1e-4  # rounds to zero in int4
    for fmt in ("int8", "int4", "fp8"):
        stored = quantize_rows(f, fmt)
        assert fmt != "int4" or stored[active[0, 0], active[0, 1]] == 0
        moved = (sae.decode(f) - sae.decode(stored)).double().norm(dim=-1) / sae.decode(stored).double().norm(dim=-1)
        bound = sae.reconstruction_error(stored, quant_elementwise_bound(stored, fmt))
        assert (moved <= bound * (1 + 1e-6) + 1e-9).all() and bound.max() > 0


def test_a_listed_latent_stored_as_zero_counts_in_a_sparse_files_bound(random_sae):
    """A sparse file lists each position's active latents; one whose value rounded to zero is still listed (its bound
    b > 0), and the true reconstruction may differ by it: the bound covers it (it counted only nonzero values)."""
    sae = random_sae(16, "topk")
    f = torch.zeros(1, sae.n)
    f[0, 3], f[0, 7] = 1.0, 0.5  # the truth
    stored, b = f.clone(), torch.zeros(1, sae.n)
    stored[0, 7], b[0, 3], b[0, 7] = 0.0, 0.01, 0.5  # latent 7 stored as 0 within its bound
    moved = float((sae.decode(f) - sae.decode(stored)).norm() / sae.decode(stored).norm())
    assert float(sae.reconstruction_error(stored, b, exact_zeros=True)[0]) >= moved > 0.05
