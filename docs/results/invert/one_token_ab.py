"""The position-0 table's pass (every token alone through the blocks, as a full calibration makes it for every layer
at once) with attention's one-key shortcut (models.lm.one_token_attention) and without it (every module's own
forward), alternating batch by batch in one process: seconds of the batches in each mode, and whether every layer's
states are equal bit for bit. Every EVERY-th batch of 1,024 tokens (1: the whole table); DTYPE: on a copy of the model
in that dtype (bfloat16: a fast calibration's position-0 sample runs so).

    python one_token_ab.py MODEL EVERY [DTYPE]        e.g. smollm2 1; gemma3-270m 8; smollm2 2 bfloat16"""
import sys
import time

import torch

from sipit.models import LayerTap, load_model
from sipit.models import lm as lm_module
from sipit.models.tap import run_taps

torch.set_num_threads(2)
model, every = sys.argv[1], int(sys.argv[2])
lm = load_model(model)
if len(sys.argv) > 3:
    lm = lm.copy_in(getattr(torch, sys.argv[3]))
taps = [LayerTap(lm, layer) for layer in range(lm.n_layers + 1)]
modes = {"own forward": set(), "one-key shortcut": lm_module.ONE_KEY_ATTENTION}
seconds, same, batches = dict.fromkeys(modes, 0.0), True, range(0, lm.vocab_size, 1024 * every)
for k, start in enumerate(batches):
    ids = torch.arange(start, min(start + 1024, lm.vocab_size))[:, None]
    states = {}
    for name in (list(modes) if k % 2 == 0 else list(modes)[::-1]):
        lm_module.ONE_KEY_ATTENTION = modes[name]
        t = time.perf_counter()
        states[name] = run_taps(lm, taps, ids)
        seconds[name] += time.perf_counter() - t
    same &= all(torch.equal(a, b) for a, b in zip(*states.values()))
dtype = str(lm.dtype).split(".")[-1]
print(f"{model} ({dtype}), {len(batches)} batches of 1,024 tokens (every {every}) through {lm.n_layers} blocks, "
      "2 threads: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
      + f" ({seconds['one-key shortcut'] / seconds['own forward']:.2f}); every layer's states equal: {same}")
