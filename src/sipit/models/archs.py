"""The paper's architectures at random initialisation: specs `random:<arch>[:seed=N]`.

Theorem 2.2 is about a decoder whose parameters are drawn from a density, which is exactly a
model at initialisation. These specs build the published architectures (the values of each
model's config.json on the Hugging Face Hub, typed in here from those files because this package
never downloads anything) with the architecture's own init under `torch.manual_seed(seed)`, on
the target device and in the target dtype directly (an 8B model is never materialised in fp32 on
the CPU first), optionally only the blocks up to `max_layer`. There is no tokenizer: ids in,
ids out.
"""
from __future__ import annotations

import hashlib

import torch

from .lm import LM, ModelError

# Published config.json values. Only fields that shape the computation are kept (dimensions,
# heads, KV heads, vocabulary, norm type and eps, activation, rope, tied embeddings, max
# positions, attention windows); special-token ids are kept so HF does not fall back to ids
# outside the vocabulary.
ARCHS: dict[str, dict] = {
    # openai-community/gpt2 (GPT-2 small, the paper's inversion table): LayerNorm, learned positions.
    "gpt2": dict(
        model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
        bos_token_id=50256, eos_token_id=50256),
    # roneneldan/TinyStories-33M (GPT-Neo): 4 layers alternating global / local (window 256) attention.
    "tinystories-33m": dict(
        model_type="gpt_neo", vocab_size=50257, max_position_embeddings=2048, hidden_size=768,
        num_layers=4, num_heads=16, attention_types=[[["global", "local"], 2]], window_size=256,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
        bos_token_id=50256, eos_token_id=50256),
    # meta-llama/Llama-3.1-8B: GQA 32/8, RMSNorm, SwiGLU, llama3 rope scaling.
    "llama-3.1-8b": dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rms_norm_eps=1e-5, hidden_act="silu", rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001),
    # mistralai/Mistral-7B-v0.1: GQA 32/8, sliding window 4096.
    "mistral-7b": dict(
        model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        rms_norm_eps=1e-5, hidden_act="silu", rope_theta=10000.0, sliding_window=4096,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    # microsoft/Phi-4-mini-instruct (Phi3 architecture): GQA 24/8, partial rotary 0.75, tied.
    # Its longrope short/long factor lists are left out (not reproducible here without the file);
    # plain rope with the published theta is used instead.
    "phi-4-mini": dict(
        model_type="phi3", vocab_size=200064, hidden_size=3072, intermediate_size=8192,
        num_hidden_layers=32, num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=131072,
        original_max_position_embeddings=4096, rms_norm_eps=1e-5, hidden_act="silu", rope_theta=10000.0,
        partial_rotary_factor=0.75, tie_word_embeddings=True,
        bos_token_id=199999, eos_token_id=199999, pad_token_id=199999),
    # google/gemma-3-1b-pt (Gemma3ForCausalLM): MQA 4/1, head_dim 256, 5 local (window 512) : 1 global.
    "gemma-3-1b": dict(
        model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912,
        num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=512, sliding_window_pattern=6,
        query_pre_attn_scalar=256, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0),
    # facebook/opt-350m (not in the paper): the one OPT whose blocks (1024) are wider than its embedding (512):
    # project_in / project_out around post-LN blocks, no final norm, ReLU, learned positions (offset 2).
    "opt-350m": dict(
        model_type="opt", vocab_size=50272, hidden_size=1024, word_embed_proj_dim=512, ffn_dim=4096,
        num_hidden_layers=24, num_attention_heads=16, max_position_embeddings=2048, do_layer_norm_before=False,
        activation_function="relu", enable_bias=True, layer_norm_elementwise_affine=True, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=2, pad_token_id=1),
    # Qwen/Qwen2.5-7B: GQA 28/4, q/k/v biases, rope theta 1e6.
    "qwen2.5-7b": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
        rms_norm_eps=1e-6, hidden_act="silu", rope_theta=1000000.0, use_sliding_window=False,
        tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151643),
}


def parse_random_spec(spec: str) -> tuple[str, int]:
    """"random:gpt2" -> ("gpt2", 0); "random:gpt2:seed=3" -> ("gpt2", 3). Raises ModelError."""
    parts = spec.split(":")
    arch = parts[1] if len(parts) > 1 else ""
    if arch not in ARCHS or len(parts) > 3 or (len(parts) == 3 and not parts[2].startswith("seed=")):
        raise ModelError(f"bad random model spec {spec!r}: use random:<arch> or random:<arch>:seed=N "
                         f"with arch one of {', '.join(ARCHS)}")
    try:
        seed = int(parts[2].removeprefix("seed=")) if len(parts) == 3 else 0
    except ValueError as e:
        raise ModelError(f"bad seed in {spec!r}: expected seed=<integer>") from e
    return arch, seed


def arch_config(arch: str, max_layer: int | None = None):
    """The transformers config of a published architecture, optionally cut to `max_layer` blocks."""
    from transformers import AutoConfig

    values = dict(ARCHS[arch])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    return truncate_config(config, max_layer) if max_layer is not None else config


def truncate_config(config, max_layer: int):
    """Keep blocks 1..max_layer only (per-layer lists such as attention types cut to match). Where the depth is the
    list's length (Nemotron-H: num_hidden_layers is read off layers_block_type, and setting it does nothing), cutting
    the list is what cuts the model; where the list is read off the depth (Mamba-2's layer_types), it is not set."""
    text = config.get_text_config()
    depth = text.num_hidden_layers
    if not 0 <= max_layer <= depth:
        raise ModelError(f"max_layer {max_layer} out of range: the model has layers 0..{depth}")
    blocks = max(1, max_layer)  # layer 0 (embeddings) still needs one block object
    text.num_hidden_layers = blocks
    for name in ("layer_types", "attention_layers"):
        derived = isinstance(getattr(type(text), name, None), property) and getattr(type(text), name).fset is None
        if isinstance(getattr(text, name, None), list) and not derived:
            setattr(text, name, getattr(text, name)[:blocks])
    return config


def random_model(spec: str, *, dtype: torch.dtype, device: torch.device, max_layer: int | None = None,
                 seed: int | None = None) -> LM:
    """Build `random:<arch>[:seed=N]` (see module docstring); `seed` overrides the spec's."""
    from transformers import AutoModelForCausalLM

    arch, spec_seed = parse_random_spec(spec)
    seed = spec_seed if seed is None else seed
    depth = arch_config(arch).get_text_config().num_hidden_layers
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(arch_config(arch, max_layer), dtype=dtype)
    redraw(model, seed, depth)
    return LM(f"random:{arch}:seed={seed}", model, None, full_layers=depth if max_layer is not None else None)


@torch.no_grad()
def redraw(model, seed: int, depth: int):
    """Draw every module's parameters again with the architecture's own `_init_weights`, each
    module under its own seed (from `seed` and the module's name), so that block i gets the same
    weights whether the model was built whole or up to max_layer (one global stream would shift
    with the number of blocks drawn before the embedding or the LM head).

    Depth-dependent init scales (GPT-2's residual projections: std 0.02/√(2L)) use the
    architecture's full `depth`. Tied parameters are drawn by the last module that holds them.
    """
    text = model.config.get_text_config()
    loaded, text.num_hidden_layers = text.num_hidden_layers, depth
    try:
        for name, module in model.named_modules():
            tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            if not tensors:
                continue
            for t in tensors:  # HF skips tensors it has marked as initialised
                t._is_hf_initialized = False
            module._is_hf_initialized = False
            digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
            torch.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
            model._init_weights(module)
            module._is_hf_initialized = True
    finally:
        text.num_hidden_layers = loaded
