import os

import pytest
import torch

from sipit.models import load_model

REAL_MODELS = ("smollm2", "gemma", "qwen")  # the markers of tests on real models


@pytest.fixture(autouse=True)
def threads(request):
    """Every test starts at one torch thread (tiny models: their small products run faster alone), those marked for a
    real model at two, as `make demo` and the benches run (a full calibration of Gemma-3-270M, 262,144 tokens of
    table and the model's own samples, took 888 s at one thread on this project's AVX2-only CPU). Set per test: a CLI
    test's `--threads` (default 2) no longer leaks into the tests after it, which ran at whatever the last one set."""
    real = any(request.node.get_closest_marker(m) for m in REAL_MODELS)
    torch.set_num_threads(min(2, os.cpu_count() or 1) if real else 1)
    yield


@pytest.fixture(scope="session", params=["tiny-gpt2", "tiny-llama"])
def tiny_lm(request):
    return load_model(request.param)


@pytest.fixture(scope="session")
def tiny_gemma3():
    """Gemma-3's architecture, tiny, with a sliding window of 8 (local layers 1, 2 and 4)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from sipit.models.lm import LM

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=8,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"])
    return LM("tiny-gemma3", Gemma3ForCausalLM(config).eval(), None)


NEMOTRON_H = dict(mamba_num_heads=4, mamba_head_dim=16, n_groups=1, chunk_size=16, n_routed_experts=4,  # (made small)
                  num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1, pad_token_id=0)
LAYOUTS = {  # Hugging Face decoders laid out unlike Llama: their blocks below the base model (OPT; Llama-4's text
    #          model, whose base-model prefix names no attribute), attention biased by a key's index (ALiBi: BLOOM,
    #          MPT), an attention module named self_attention (BLOOM, Falcon), blocks wider than the embedding and
    #          normed at their end, no final norm (OPT-350m: project_in 512 -> 1024, project_out back), several
    #          residual streams and per-layer token embeddings, the last block reading an earlier one's keys and
    #          values (Gemma-3n), a head width that differs by layer in transformers' per-layer config (Gemma-4), a
    #          cache of a compressed latent and a rotary part, of other widths (DeepSeek-V3's multi-head latent
    #          attention), blocks with a recurrent state beside attention ones (LFM2's short convolutions, Qwen3-Next's
    #          and Qwen3.5's gated delta nets, Jamba's Mamba blocks, Falcon-H1's Mamba beside attention in every block)
    "opt": dict(ffn_dim=64, word_embed_proj_dim=32, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "opt-350m": dict(model_type="opt", ffn_dim=64, word_embed_proj_dim=24, do_layer_norm_before=False, pad_token_id=0,
                     bos_token_id=1, eos_token_id=2),
    "llama4_text": dict(num_key_value_heads=2, head_dim=8, intermediate_size_mlp=64, num_local_experts=2,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "bloom": dict(n_layer=3, n_head=4),
    "mpt": dict(d_model=32, n_layers=3, n_heads=4),
    "falcon": {},
    "gemma3n_text": dict(num_key_value_heads=2, head_dim=8, vocab_size_per_layer_input=96,
                         hidden_size_per_layer_input=8, laurel_rank=4, altup_num_inputs=2, num_kv_shared_layers=1,
                         sliding_window=4,
                         layer_types=["sliding_attention", "full_attention", "full_attention"],
                         activation_sparsity_pattern=[0.95, 0.0, 0.0]),
    "deepseek_v3": dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
                        qk_nope_head_dim=4, v_head_dim=8, n_group=1, topk_group=1, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2),
    "gemma4_text": dict(num_key_value_heads=2, head_dim=8, global_head_dim=16, vocab_size_per_layer_input=96,
                        hidden_size_per_layer_input=8, sliding_window=4, attention_k_eq_v=True),
    "lfm2": dict(num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"]),
    "qwen3_next": dict(num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention",
                                                                       "linear_attention"]),
    "qwen3_5_text": dict(num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention",
                                                                         "linear_attention"]),
    "jamba": dict(num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, pad_token_id=0),
    "falcon_h1": dict(num_key_value_heads=2, head_dim=8, pad_token_id=0, mamba_chunk_size=16),  # (its reference
    #              scan pads every pass to a chunk: 256 tokens by default)
    # Mamba-2 hybrids: Nemotron-H's blocks of one kind each (Mamba, attention, MoE: a `mixer`), its MoE block before
    # the attention; GraniteMoE-Hybrid's attention last (taps below it)
    "nemotron_h": dict(num_key_value_heads=2, head_dim=8, hybrid_override_pattern="M*E", **NEMOTRON_H),
    "nemotron_h-moe-first": dict(model_type="nemotron_h", num_key_value_heads=2, head_dim=8,
                                 hybrid_override_pattern="ME*", **NEMOTRON_H),
    "granitemoehybrid": dict(num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=16, mamba_chunk_size=16,
                             layer_types=["mamba", "mamba", "attention"], pad_token_id=0),
    # Zamba2: its hybrid blocks run one shared attention block (tied weights, adapters of their own; it reads the
    # hidden state beside the token embeddings, so its heads span 2d), then a Mamba-2 block
    "zamba2": dict(num_key_value_heads=4, head_dim=16, mamba_headdim=16, n_mamba_heads=4, chunk_size=16,
                   layers_block_type=["hybrid", "mamba", "hybrid"], num_mem_blocks=1, use_shared_attention_adapter=True,
                   adapter_rank=4, pad_token_id=0),
}


@pytest.fixture(scope="session")
def small_decoder():
    """small_decoder(layout) -> a 3-block random LM of a LAYOUTS entry (d = 32, V = 96), no tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from sipit.models.lm import LM

    def build(layout: str) -> LM:
        options = dict(LAYOUTS[layout])
        config = AutoConfig.for_model(options.pop("model_type", layout), vocab_size=96, hidden_size=32,
                                      intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, **options)
        torch.manual_seed(0)
        return LM(layout, AutoModelForCausalLM.from_config(config).eval(), None)

    return build


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2")


@pytest.fixture(scope="session")
def saved_tiny(tmp_path_factory):
    """saved_tiny("tiny-llama") -> (the model, a directory holding it as `save_pretrained` writes it):
    loaded back it goes through the Hugging Face path, which takes max_layer (tiny specs load whole)."""
    saved = {}

    def save(spec: str):
        if spec not in saved:
            lm = load_model(spec)
            d = tmp_path_factory.mktemp("hf") / spec
            lm.model.save_pretrained(d)
            lm.tokenizer.save_pretrained(d)
            saved[spec] = lm, str(d)
        return saved[spec]

    return save



@pytest.fixture(scope="session")
def capture():
    """capture(path, model, layer, lines): `sipit capture --file` of the text lines into path."""
    from sipit.cli import main

    def capture(path, model, layer, lines):
        text = path.with_suffix(".txt")
        text.write_text("\n".join(lines) + "\n")
        assert main(["--threads", "1", "capture", "--model", model, "--layer", str(layer), "--file", str(text),
                     "-o", str(path)]) == 0
        text.unlink()

    return capture


@pytest.fixture(scope="session")
def random_sae():
    """random_sae(d, architecture, ...) -> a random SAE (models/sae.py) of d inputs, 4d latents, on a layer's
    residual stream (hook: layer 2 by default)."""
    from sipit.models.sae import SAE, hook_layer

    def build(d, architecture="standard", n=None, seed=0, hook="blocks.1.hook_resid_post", **kw):
        g = torch.Generator().manual_seed(seed)
        n = n or 4 * d
        W = torch.randn(d, n, generator=g) / d ** 0.5
        extra = {"topk": dict(k=6), "jumprelu": dict(threshold=torch.rand(n, generator=g) * 0.5),
                 "gated": dict(gate=(torch.randn(n, generator=g) * 0.3, torch.randn(n, generator=g) * 0.1,
                                     torch.randn(n, generator=g) * 0.1))}.get(architecture, {})
        return SAE(W, torch.randn(n, generator=g) * 0.1, W.T.clone(), torch.randn(d, generator=g) * 0.01, architecture,
                   hook_layer(hook), hook_name=hook, **{**extra, **kw})

    return build
