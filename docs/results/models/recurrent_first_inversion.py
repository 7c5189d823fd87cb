"""First inversion of one 12-token prompt at layer 3 on an empty SIPIT_CACHE, tiny random hybrid models with their
default chunk sizes (transformers' reference scans pad a pass to a chunk). `python recurrent_first_inversion.py MODEL_TYPE ...` (qwen3_next, granitemoehybrid, nemotron_h)."""
import sys
import time
import warnings

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from sipit.invert import InvertConfig, invert
from sipit.models import LayerTap
from sipit.models.lm import LM

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
H = dict(num_key_value_heads=2, head_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)
C = {"qwen3_next": dict(H, layer_types=["linear_attention", "full_attention", "linear_attention"]),
     "granitemoehybrid": dict(H, mamba_n_heads=4, mamba_d_head=16, layer_types=["mamba", "attention", "mamba"]),
     "nemotron_h": dict(H, mamba_num_heads=4, mamba_head_dim=16, n_groups=1, hybrid_override_pattern="M*M")}
for mt in sys.argv[1:]:
    config = AutoConfig.for_model(mt, vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                  num_attention_heads=4, **C[mt])
    torch.manual_seed(0)
    lm = LM(mt, AutoModelForCausalLM.from_config(config).eval(), None)
    ids = torch.randint(0, lm.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    full = LayerTap(lm, 3).states(ids)
    t = time.perf_counter()
    r = invert(lm, full[None], 3, InvertConfig(calibration_tokens=8192), progress=False,
               true_ids=[ids.tolist()])
    print(mt, r.prompts[0].status, r.prompts[0].exact, f"{time.perf_counter() - t:.1f} s", flush=True)
