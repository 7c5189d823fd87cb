"""Which Hugging Face decoders sipit inverts: a 3-block random model of each model type (d = 32, V = 96, built from
its transformers config, no download), 3 prompts of 10 random ids, states at layer 3 (one full forward) and the KV
cache of layer 2 inverted in lock-step under the measured ε. `python decoders.py [MODEL_TYPE ...]` -> one line each
(opt-350m is a layout of the opt model type: its 350m size's, blocks wider than the embedding).

The model types the suite does not build (tests/conftest.py LAYOUTS and tests/models/test_lm.py build the rest) are
checked here, on the transformers version installed."""
import sys
import time
import warnings

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from sipit.invert import invert
from sipit.models import LayerTap
from sipit.models import ModelError
from sipit.models.lm import LM
from sipit.models.surfaces import KVTap

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # inside the 96-token vocabulary
HEADS = dict(num_key_value_heads=2, head_dim=8)
CONFIGS = {  # what each model type needs beyond vocab_size=96, hidden_size=32, intermediate_size=64, 3 blocks, 4 heads
    "llama": HEADS, "mistral": HEADS, "qwen2": HEADS, "qwen3": HEADS, "gemma": HEADS, "gemma2": HEADS,
    "gemma3_text": dict(HEADS, sliding_window=4), "gpt2": dict(n_embd=32, n_layer=3, n_head=4),
    "gpt_neo": dict(num_layers=3, num_heads=4, attention_types=[[["global", "local"], 1], [["global"], 1]]),
    "gpt_neox": {}, "gptj": dict(n_embd=32, n_layer=3, n_head=4, rotary_dim=4),
    "codegen": dict(n_embd=32, n_layer=3, n_head=4, rotary_dim=4), "gpt_bigcode": dict(n_embd=32, n_layer=3, n_head=4),
    "opt": dict(IDS, ffn_dim=64, word_embed_proj_dim=32), "bloom": dict(n_layer=3, n_head=4),
    "mpt": dict(d_model=32, n_layers=3, n_heads=4), "falcon": {}, "phi": {}, "phi3": dict(IDS),
    "stablelm": dict(num_key_value_heads=4), "olmo": {}, "olmo2": {}, "olmo3": {}, "cohere": {}, "granite": {},
    "starcoder2": {}, "mixtral": dict(HEADS, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_key_value_heads=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                      num_experts=4, num_experts_per_tok=2),
    "llama4_text": dict(**HEADS, **IDS, intermediate_size_mlp=64, num_local_experts=2),
    "smollm3": dict(IDS, num_key_value_heads=2),
    "glm": dict(HEADS, pad_token_id=0, eos_token_id=[1]), "exaone4": HEADS, "seed_oss": HEADS, "ernie4_5": {},
    "apertus": {}, "hunyuan_v1_dense": dict(HEADS, rope_theta=10000.0),
    # OPT-350m's layout (blocks wider than the embedding, no final norm); Gemma-3n's text model (2 residual streams,
    # per-layer token embeddings, the last block reading block 1's keys and values: its KV surface is block 1's)
    "opt-350m": dict(IDS, model_type="opt", ffn_dim=64, word_embed_proj_dim=24, do_layer_norm_before=False),
    "gemma3n_text": dict(HEADS, vocab_size_per_layer_input=96, hidden_size_per_layer_input=8, laurel_rank=4,
                         altup_num_inputs=2, num_kv_shared_layers=1, sliding_window=4,
                         layer_types=["sliding_attention", "full_attention", "full_attention"],
                         activation_sparsity_pattern=[0.95, 0.0, 0.0]),
    # Gemma-4's text model: a head width by layer (8 sliding, 16 global), per-layer token embeddings, keys as values
    "gemma4_text": dict(HEADS, global_head_dim=16, vocab_size_per_layer_input=96, hidden_size_per_layer_input=8,
                        sliding_window=4, attention_k_eq_v=True),
    # more model types of this transformers, MoEs with 4 experts (top 2)
    "qwen3_moe": dict(HEADS, **IDS, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "gpt_oss": dict(HEADS, **IDS, num_local_experts=4, num_experts_per_tok=2, sliding_window=4),
    "deepseek_v3": dict(IDS, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
                        qk_nope_head_dim=4, v_head_dim=8, n_group=1, topk_group=1),
    "glm4": dict(HEADS, **IDS), "glm4_moe": dict(HEADS, **IDS, n_routed_experts=4, num_experts_per_tok=2,
                                                 moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
                                                 topk_group=1),
    "cohere2": dict(HEADS, **IDS), "ministral": dict(HEADS, **IDS), "ministral3": dict(HEADS, **IDS),
    "olmoe": dict(HEADS, **IDS, num_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(HEADS, **IDS, num_local_experts=4, num_experts_per_tok=2), "helium": dict(HEADS, **IDS),
    "arcee": dict(HEADS, **IDS), "nemotron": dict(HEADS, **IDS), "exaone": dict(HEADS, **IDS),
    "internlm3": dict(HEADS, **IDS), "bitnet": dict(HEADS, **IDS), "vaultgemma": dict(HEADS, **IDS),
    "phimoe": dict(HEADS, **IDS, num_local_experts=4, num_experts_per_tok=2),
    "jetmoe": dict(IDS, num_local_experts=4, num_experts_per_tok=2, kv_channels=8),
    "ernie4_5_moe": dict(HEADS, **IDS, moe_num_experts=4, moe_k=2, moe_intermediate_size=32),
    "hunyuan_v1_moe": dict(HEADS, **IDS, num_experts=4, moe_topk=2, rope_theta=10000.0),
    "xglm": dict(HEADS, **IDS), "persimmon": dict(HEADS, **IDS), "biogpt": dict(HEADS, **IDS),
    "minicpm3": dict(IDS, num_key_value_heads=4, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=8, kv_lora_rank=16,
                     q_lora_rank=16),
}
# Blocks with a recurrent state (short convolutions, Mamba, gated delta nets, RG-LRU) beside attention blocks: a
# prefix's state is grown in a pass of its own where it cannot be cut back (models/tap.py); a block with no attention
# has no KV cache surface (a ModelError says so), and a model without any (Mamba, FalconMamba) none at all. Mamba-2
# chunk sizes made small: transformers' reference scan (no mamba_ssm here) pads every pass to a chunk
RECURRENT = {
    "lfm2": dict(HEADS, **IDS, layer_types=["conv", "full_attention", "conv"]),
    "lfm3": dict(HEADS, **IDS),
    "falcon_h1": dict(HEADS, **IDS, mamba_chunk_size=16),
    "jamba": dict(HEADS, **IDS, attn_layer_period=2, attn_layer_offset=1),
    "qwen3_next": dict(HEADS, **IDS, layer_types=["linear_attention", "full_attention", "linear_attention"]),
    "qwen3_5_text": dict(HEADS, **IDS, layer_types=["linear_attention", "full_attention", "linear_attention"]),
    "olmo_hybrid": dict(HEADS, **IDS), "minimax": dict(HEADS, **IDS), "recurrent_gemma": dict(HEADS, **IDS),
    # Mamba-2 blocks: heads made few (their default widths, e.g. Nemotron-H's 128 heads of 64, make a 32-wide model's
    # reference scan take minutes) and in one group (Mamba-2's default 8 groups of 4 heads fail inside transformers);
    # Nemotron-H's default layout (Mamba, MoE, attention, MLP: 4 blocks whatever num_hidden_layers says), Bamba and
    # GraniteMoE-Hybrid given an attention block (their defaults at 3 blocks have none)
    "nemotron_h": dict(HEADS, **IDS, chunk_size=16, mamba_num_heads=4, mamba_head_dim=16, n_groups=1,
                       n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1),
    "bamba": dict(HEADS, **IDS, mamba_n_heads=4, mamba_d_head=16, mamba_chunk_size=16, attn_layer_indices=[1]),
    "granitemoehybrid": dict(HEADS, **IDS, mamba_n_heads=4, mamba_d_head=16, mamba_chunk_size=16,
                             layer_types=["mamba", "attention", "mamba"]),
    "zamba2": dict(HEADS, **IDS, mamba_headdim=16, n_mamba_heads=4, chunk_size=16,
                   layers_block_type=["mamba", "hybrid", "mamba"]),
    "zamba": dict(HEADS, **IDS),
    "mamba": dict(IDS), "falcon_mamba": dict(IDS),
    "mamba2": dict(IDS, num_heads=4, head_dim=16, chunk_size=16, n_groups=1),
}


def check(model_type: str) -> str:
    options = dict(CONFIGS[model_type] if model_type in CONFIGS else RECURRENT[model_type])
    config = AutoConfig.for_model(options.pop("model_type", model_type), vocab_size=96, hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, **options)
    torch.manual_seed(0)
    lm = LM(model_type, AutoModelForCausalLM.from_config(config).eval(), None)
    ids = torch.randint(0, lm.vocab_size, (3, 10), generator=torch.Generator().manual_seed(1))
    out = []
    for surface, make in (("L3", lambda: LayerTap(lm, 3)), ("kv:both:L2", lambda: KVTap(lm, 2, "both"))):
        start = time.perf_counter()
        try:
            tap = make()
            r = invert(lm, tap.states(ids), tap.layer, progress=False, true_ids=ids.tolist(), tap=tap)
        except ModelError as e:  # (a surface the model does not have: a recurrent block keeps no keys and values)
            out.append(f"{surface}: ModelError: {str(e)[:120]}")
            continue
        statuses = "/".join(sorted({p.status for p in r.prompts}))
        out.append(f"{tap.key}: {sum(p.exact for p in r.prompts)}/3 exact, {statuses}, eps {r.eps:.1e}, "
                   f"{time.perf_counter() - start:.1f} s")
    return f"{model_type:17s} {type(lm.model).__name__:24s} " + " | ".join(out)


if __name__ == "__main__":
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, 2 threads")
    for model_type in sys.argv[1:] or [*CONFIGS, *RECURRENT]:
        try:
            print(check(model_type), flush=True)
        except Exception as e:  # a model type this transformers cannot build or sipit cannot read: say which, go on
            print(f"{model_type:17s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
