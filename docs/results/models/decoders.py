"""Which Hugging Face decoders sipit inverts: a 3-block random model of each model type (d = 32, V = 96, built from
its transformers config, no download), 3 prompts of 10 random ids, states at layer 3 (one full forward) and the KV
cache of layer 2 inverted in lock-step under the measured ε. `python decoders.py [MODEL_TYPE ...]` -> one line each.

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
}


def check(model_type: str) -> str:
    config = AutoConfig.for_model(model_type, vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                  num_attention_heads=4, **CONFIGS[model_type])
    torch.manual_seed(0)
    lm = LM(model_type, AutoModelForCausalLM.from_config(config).eval(), None)
    ids = torch.randint(0, lm.vocab_size, (3, 10), generator=torch.Generator().manual_seed(1))
    out = []
    for tap in (LayerTap(lm, 3), KVTap(lm, 2, "both")):
        start = time.perf_counter()
        r = invert(lm, tap.states(ids), tap.layer, progress=False, true_ids=ids.tolist(), tap=tap)
        statuses = "/".join(sorted({p.status for p in r.prompts}))
        out.append(f"{tap.key}: {sum(p.exact for p in r.prompts)}/3 exact, {statuses}, eps {r.eps:.1e}, "
                   f"{time.perf_counter() - start:.1f} s")
    return f"{model_type:17s} {type(lm.model).__name__:24s} " + " | ".join(out)


if __name__ == "__main__":
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, 2 threads")
    for model_type in sys.argv[1:] or CONFIGS:
        try:
            print(check(model_type), flush=True)
        except Exception as e:  # a model type this transformers cannot build or sipit cannot read: say which, go on
            print(f"{model_type:17s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
