"""How far a bfloat16 (or float16) model's states lie from float32's: run.py's saved states (SmolLM2 in that dtype, one
transformers forward) against a float32 forward of the same ids, relative distance per position (median, min, max over prompts and
positions) at each layer; beside it, float32 states merely stored as bfloat16, and the saved states' largest entry
(float16's own limit is 65,504).

    python precision_gap.py OUT LAYERS        e.g. python precision_gap.py sure-1237 1,15,30"""
import sys
from pathlib import Path

import torch

from sipit.models import load_model

torch.set_num_threads(2)
out, layers = Path(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
saved = torch.load(next(out.glob("*-states-seed*.pt")))
lm = load_model("smollm2")
with torch.no_grad():
    fp32 = lm.model(input_ids=saved["input_ids"], output_hidden_states=True).hidden_states


def rel(x, ref):
    return ((x.double() - ref.double()).norm(dim=-1) / ref.double().norm(dim=-1)).flatten()


for layer in layers:
    computed, stored = rel(saved["hidden_states"][layer], fp32[layer]), rel(fp32[layer].bfloat16(), fp32[layer])
    print(f"layer {layer}: computed in {saved['hidden_states'][layer].dtype} median {computed.median():.4f} (min {computed.min():.4f}, max "
          f"{computed.max():.4f}); float32 stored as bfloat16 max {stored.max():.4f}; largest |h| "
          f"{float(saved['hidden_states'][layer].float().abs().max()):.0f}")
