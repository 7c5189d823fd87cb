"""Model loading and layer taps: parity with one full Hugging Face forward pass.

Tolerance: float32 recomputation along a different path (KV cache, batch of candidates) differs
from the full forward by rounding only: measured ≤ 6e-7 relative on SmolLM2 and ≤ 1.2e-6 on
Gemma-3 (hidden norms up to 3.5e4), so 1e-5 relative leaves margin without hiding a real bug
(a wrong position or missing block changes states by O(1) relative).
"""
import importlib.util
import json
import os

import pytest
import torch

from sipit.models import LayerTap, ModelError, load, load_model

RTOL = 1e-5
TEXT = "The quick brown fox jumps over the lazy dog."


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def check_parity(lm, text=TEXT):
    """extend() on a cached prefix == HF full forward, at first, middle, last layer, pre/post norm."""
    ids = torch.tensor(lm.encode(text))
    with torch.no_grad():
        hf = lm.model(ids[None], output_hidden_states=True).hidden_states
    L = lm.n_layers
    for layer in (0, 1, L // 2, L):
        for final_norm in (False, True):
            tap = LayerTap(lm, layer, final_norm)
            # HF's last entry is post-norm; the others are raw residual streams.
            if layer == L:
                ref = hf[L][0] if final_norm else None
            else:
                ref = lm.norm(hf[layer][0]) if final_norm else hf[layer][0]
            full = tap.states(ids)
            if ref is not None:
                assert rel(full, ref) < RTOL, (layer, final_norm)
            else:  # raw last layer: HF's post-norm state is its norm
                assert rel(lm.norm(full), hf[L][0]) < RTOL
            for t in (1, len(ids) - 1):
                prefix = tap.prefill(ids[:t])
                cand = torch.stack([ids[t], (ids[t] + 1) % lm.vocab_size, ids[t]])
                ext = tap.extend(prefix, cand)
                assert rel(ext[0], full[t]) < RTOL and rel(ext[2], full[t]) < RTOL, (layer, final_norm, t)
                # multi-token extension: the rest of the prompt after a prefix
                rest = tap.extend(prefix, ids[None, t:])[0]
                assert rel(rest, full[t:]) < RTOL


def test_tiny_parity(tiny_lm):
    check_parity(tiny_lm)


@pytest.mark.smollm2
def test_smollm2_parity(smollm2):
    assert (smollm2.n_layers, smollm2.d_model, smollm2.vocab_size) == (30, 576, 49152)
    check_parity(smollm2)


@pytest.mark.gemma
def test_gemma_parity():
    lm = load_model("gemma3-270m")
    assert (lm.n_layers, lm.d_model, lm.vocab_size) == (18, 640, 262144)
    assert lm.encode("hi")[0] == lm.tokenizer.bos_token_id  # BOS gets a state like any token
    check_parity(lm, "Paris is the capital of France.")


def test_tiny_models_are_deterministic_and_round_trip_text(tiny_lm):
    again = load_model(tiny_lm.name)
    for a, b in zip(tiny_lm.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)
    text = "naïve café — 日本語 ok"
    assert tiny_lm.decode(tiny_lm.encode(text)) == text


def test_blocks_above_layer_never_run(tiny_lm):
    ran = []
    hooks = [b.register_forward_hook(lambda m, a, o, i=i: ran.append(i)) for i, b in enumerate(tiny_lm.blocks)]
    try:
        tap = LayerTap(tiny_lm, 2)
        tap.extend(tap.prefill(torch.tensor([1, 2, 3])), torch.tensor([4, 5]))
    finally:
        for h in hooks:
            h.remove()
    assert ran and max(ran) == 1  # layer 2 = output of the 2nd block (index 1)


def test_extend_embeds_has_gradients(tiny_lm):
    tap = LayerTap(tiny_lm, 2)
    prefix = tap.prefill(torch.tensor([1, 2, 3]))
    e = tiny_lm.embed(torch.tensor([7])).clone().requires_grad_(True)
    tap.extend_embeds(prefix, e).pow(2).sum().backward()
    assert e.grad is not None and e.grad.abs().sum() > 0
    assert torch.allclose(tap.extend_embeds(prefix, e.detach()), tap.extend(prefix, torch.tensor([7])), rtol=1e-5, atol=1e-6)


def test_prefix_crop_matches_fresh_prefill(tiny_lm):
    tap = LayerTap(tiny_lm, -1)
    ids = torch.tensor(tiny_lm.encode("abcdefgh"))
    long = tap.prefill(ids)
    cand = torch.tensor([10, 20])
    assert torch.allclose(tap.extend(long.crop(3), cand), tap.extend(tap.prefill(ids[:3]), cand), atol=1e-6)


@pytest.mark.parametrize("layer", [5, -6, 100])
def test_layer_out_of_range(tiny_lm, layer):
    with pytest.raises(ModelError, match="out of range"):
        LayerTap(tiny_lm, layer)


@pytest.mark.parametrize("spec,msg", [("nonsense", "unknown model spec"), ("missing.gguf", "GGUF file not found"),
                                      ("./no/such/dir", "unknown model spec")])
def test_bad_model_spec(spec, msg):
    with pytest.raises(ModelError, match=msg):
        load_model(spec)


def test_missing_gguf_package_is_named(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="needs the `gguf` package"):
        load_model(str(f))


def test_corrupt_gguf(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"not a gguf file")
    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="cannot read GGUF"):
        load_model(str(f))


# ---------------------------------------------------------------------------------------------- HF directories


@pytest.fixture(scope="module")
def hf_dir(saved_tiny):
    """tiny-llama saved as a Hugging Face directory, loaded back offline."""
    return saved_tiny("tiny-llama")


def test_hf_directory_loads_whole_and_truncated(hf_dir):
    ref, d = hf_dir
    ids = torch.tensor(ref.encode("round trip"))
    whole = load_model(d)
    assert whole.fingerprint == ref.fingerprint  # same weights, same tokenizer: the same cache key
    for layer in (1, 2, 4):
        assert torch.equal(LayerTap(whole, layer).states(ids), LayerTap(ref, layer).states(ids))
    cut = load_model(d, max_layer=2)
    assert (cut.n_layers, cut.full_layers) == (2, 4) and len(cut.blocks) == 2
    for layer in (0, 1, 2, -3):
        assert torch.equal(LayerTap(cut, layer).states(ids), LayerTap(ref, layer).states(ids))
    with pytest.raises(ModelError, match="max_layer=2"):
        LayerTap(cut, 3)
    with pytest.raises(ModelError, match="max_layer=2"):
        LayerTap(cut, -1)  # the architecture's last block, not the last one loaded


def test_next_token_logprobs_need_every_block_not_a_load_without_max_layer(hf_dir):
    """`bench invert --layers 1,15,30` loads with max_layer=30 = depth: the LM's ranking must stay on."""
    ref, d = hf_dir
    ids = torch.tensor(ref.encode("round trip"))
    assert torch.equal(load_model(d, max_layer=4).next_token_logprobs(ids), ref.next_token_logprobs(ids))
    assert load_model(d, max_layer=3).next_token_logprobs(ids) is None


def test_hf_directory_loads_in_bf16_directly(hf_dir, monkeypatch):
    """A float precision is the dtype of the load itself: no float32 copy is ever made."""
    ref, d = hf_dir
    casts = []
    real_to = torch.nn.Module.to
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: casts.append(a) or real_to(self, *a, **k))
    lm = load_model(d, precision="bf16")
    assert lm.precision == "bf16" and {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    assert not [a for a in casts if torch.bfloat16 in a]  # no cast after a float32 load
    monkeypatch.undo()
    assert torch.equal(lm.embed.weight, ref.embed.weight.bfloat16())


@pytest.mark.parametrize("model_type", ["llava", "mistral3", "qwen2_vl", "gemma3"])
def test_image_text_directory_loads_its_language_model(saved_tiny, tmp_path, model_type):
    """An image-text model's directory (no causal-LM class but Gemma-3's) loads whole or to max_layer, and the LM reads
    its language model, not the vision tower whose block list is as long here (3): states equal the model's own
    hidden_states, and text inverts exactly."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from sipit.invert import invert

    tok = saved_tiny("tiny-llama")[0].tokenizer
    V = len(tok)
    text = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = {"llava": dict(text_config=dict(text, model_type="llama"), image_token_index=V - 1,
                            vision_config=dict(vision, model_type="clip_vision_model")),
              "mistral3": dict(text_config=dict(text, model_type="mistral"), image_token_index=V - 1,
                               vision_config=dict(vision, model_type="pixtral", head_dim=8)),
              "qwen2_vl": dict(text_config=dict(text, model_type="qwen2_vl_text",
                                                rope_scaling=dict(type="mrope", mrope_section=[1, 1, 2])),
                               vision_config=dict(depth=3, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2),
                               image_token_id=V - 1, video_token_id=V - 2, vision_start_token_id=V - 3),
              "gemma3": dict(text_config=dict(text, model_type="gemma3_text"), mm_tokens_per_image=4,
                             vision_config=dict(vision, model_type="siglip_vision_model"),
                             image_token_index=V - 1, boi_token_index=V - 2, eoi_token_index=V - 3)}[model_type]
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(model_type, **config)).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    ids = torch.tensor([tok.encode(TEXT)[:10]])
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    for max_layer in (None, 2):
        lm = load_model(str(tmp_path), max_layer=max_layer)
        assert type(lm.model) is type(model) and len(lm.blocks) == (max_layer or 3)
        states = LayerTap(lm, 2).states(ids)
        assert torch.allclose(states, hidden[2], rtol=RTOL, atol=RTOL * float(hidden[2].abs().max()))
        assert invert(lm, states, 2, progress=False).prompts[0].ids == ids[0].tolist()


def test_a_directory_without_a_tokenizer_takes_ids(small_decoder, tmp_path):
    """A model saved without its tokenizer (here OPT-350m's, Gemma-3n's and DeepSeek-V3's layouts): transformers hands
    it an empty tokenizer, which encoded every text to nothing (the first inversion crashed measuring ε); it loads
    without one, and `sipit capture --ids` then `sipit invert` recover the ids exactly (states, or a KV cache)."""
    from safetensors import safe_open

    from sipit.cli import main

    ids = tmp_path / "ids.txt"
    ids.write_text("5,9,22,40,7,61,3,88\n11 2 95 60 33 17 4 4 70\n")
    for layout, surface in (("opt-350m", "states"), ("gemma3n_text", "states"), ("deepseek_v3", "kv")):
        d = tmp_path / layout  # (DeepSeek-V3's KV cache: keys and values of other widths, which a file may hold)
        small_decoder(layout).model.save_pretrained(d)
        assert load_model(str(d)).tokenizer is None
        states, results = tmp_path / f"{layout}.safetensors", tmp_path / f"{layout}.jsonl"
        assert main(["capture", "--model", str(d), "--surface", surface, "--layer", "2", "--ids", str(ids),
                     "-o", str(states)]) == 0
        assert main(["invert", str(states), "--model", str(d), "-o", str(results), "--quiet"]) == 0
        prompts = [json.loads(line) for line in results.read_text().splitlines()]
        assert [p["ids"] for p in prompts] == [[5, 9, 22, 40, 7, 61, 3, 88], [11, 2, 95, 60, 33, 17, 4, 4, 70]]
        assert [p["status"] for p in prompts] == ["ok", "ok"]


def test_a_hybrid_directory_loads_only_the_blocks_asked_for(small_decoder, tmp_path):
    """Nemotron-H reads its depth off its list of block kinds (num_hidden_layers is ignored), Mamba-2 its list of
    layer types off its depth (a property without a setter): max_layer loaded every Nemotron-H block and failed on
    Mamba-2. Both load blocks 1..max_layer, whose states are the whole model's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    mamba2 = AutoConfig.for_model("mamba2", vocab_size=96, hidden_size=32, num_hidden_layers=3, num_heads=4,
                                  head_dim=16, n_groups=1, chunk_size=16)
    torch.manual_seed(0)
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    models = {"nemotron_h": small_decoder("nemotron_h").model, "mamba2": AutoModelForCausalLM.from_config(mamba2)}
    for name, model in models.items():
        model.save_pretrained(tmp_path / name)
        full, cut = load_model(str(tmp_path / name)), load_model(str(tmp_path / name), max_layer=2)
        assert (full.n_layers, cut.n_layers, cut.depth) == (3, 2, 3)
        assert torch.equal(LayerTap(full, 2).states(ids), LayerTap(cut, 2).states(ids))


def test_max_layer_out_of_range(hf_dir):
    with pytest.raises(ModelError, match="max_layer 9 out of range"):
        load_model(hf_dir[1], max_layer=9)
    with pytest.raises(ModelError, match="tiny models always load whole"):
        load_model("tiny-gpt2", max_layer=1)


def test_embedded_models_are_listed():
    from sipit.models import embedded_status

    s = embedded_status()
    assert {"smollm2", "gemma3-270m", "qwen2.5-coder-1.5b", "random:gpt2", "random:llama-3.1-8b", "tiny-gpt2"} <= set(s)
    assert s["random:gpt2"]["installed"]


def _qwen_installed() -> bool:
    from sipit.models import embedded_status

    return embedded_status()["qwen2.5-coder-1.5b"]["installed"]


@pytest.mark.qwen
@pytest.mark.skipif(not _qwen_installed(), reason="needs `make install-qwen`")
def test_qwen_parity():
    """Qwen2.5-Coder-1.5B (qwen2: q/k/v biases, GQA 12/2, tied embeddings): extend() == full forward
    at the first, middle and last layer, pre and post final norm."""
    lm = load_model("qwen2.5-coder-1.5b")
    assert (lm.n_layers, lm.d_model, lm.vocab_size) == (28, 1536, 151936)
    assert lm.model.config.num_key_value_heads == 2
    check_parity(lm, "def add(a, b):\n    return a + b")


@pytest.mark.smollm2
def test_fast_gguf_reading_parses_what_transformers_parses(monkeypatch):
    """_gguf_read_once's plain-array reader and string decoding: every field and tensor of SmolLM2's GGUF, and
    transformers' whole parse of it (config and tokenizer: 49k tokens, 48k merges), the same as without them."""
    import gguf
    import numpy as np
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    path, saved = str(load._embedded_gguf("smollm2")), (gguf.GGUFReader, hf_gguf._gguf_parse_value)
    with load._gguf_read_once():
        fast = gguf.GGUFReader(path)
        assert type(fast.data) is np.ndarray and gguf.GGUFReader(path) is fast  # (read once)
        parsed = hf_gguf.load_gguf_checkpoint(path, return_tensors=False)
    assert (gguf.GGUFReader, hf_gguf._gguf_parse_value) == saved
    plain = gguf.GGUFReader(path)
    monkeypatch.setattr(gguf, "GGUFReader", lambda *args, **kwargs: plain)  # (transformers' parse reads it once)
    assert hf_gguf.load_gguf_checkpoint(path, return_tensors=False) == parsed
    assert list(fast.fields) == list(plain.fields) and len(parsed["tokenizer"]["tokens"]) == 49152
    for name, field in plain.fields.items():
        other = fast.fields[name]
        assert other.types == field.types and other.data == field.data
        assert all(np.array_equal(a, b) for a, b in zip(other.parts, field.parts, strict=True))
    for a, b in zip(fast.tensors, plain.tensors, strict=True):
        assert (a.name, a.tensor_type, list(a.shape)) == (b.name, b.tensor_type, list(b.shape))
        assert np.array_equal(a.data, b.data)


def test_stale_dequantized_copies_are_those_whose_gguf_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("SIPIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "cache" / "dequantized"
    ggufs = {name: tmp_path / f"{name}.gguf" for name in ("kept", "changed", "gone")}
    for name, f in ggufs.items():
        f.write_bytes(b"GGUF")
        (root / name).mkdir(parents=True)
        (root / name / load.SOURCE).write_text(json.dumps(load._source(f)))
    ggufs["changed"].write_bytes(b"GGUF, reinstalled")
    ggufs["gone"].unlink()
    (root / "unrecorded").mkdir()  # an older sipit's copy no load has used since
    (root / "tmpkilled").mkdir()  # a killed load's unfinished copy
    os.utime(root / "tmpkilled", (0, 0))
    (root / "tmpbusy").mkdir()  # a load under way
    assert sorted(p.name for p in load.stale_dequantized()) == ["changed", "gone", "tmpkilled", "unrecorded"]
