"""A prompt that starts with the tokenizer's <bos> (as tokenizers encode text by default), inverted with a fast
calibration: seconds, exactness and how many candidates position 0 tried. Its state at position 0 is one a linear
model of the embedding rows does not predict; e80c51f had a search at position 0 try the special tokens first, and
since bfd8fe5 their exact states are among the kept first tokens (first_tokens). The same with the newline token first.

    python first_token_special.py MODEL LAYER        e.g. gemma3-270m 9"""
import sys
import time

import torch

torch.set_num_threads(2)
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
model, layer = sys.argv[1], int(sys.argv[2])
lm = load_model(model)
tok = lm.tokenizer
print("bos", getattr(tok, "bos_token_id", None), "eos", getattr(tok, "eos_token_id", None))
text = "The quick brown fox jumps over the lazy dog and runs away."
body = lm.encode(text)[:12]
tap = LayerTap(lm, layer)
engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("fast")),
               eps=tolerance_for(tap, {torch.float32}).eps)
for first in [tok.bos_token_id, lm.encode("\n")[-1]]:  # (<bos>, and the newline token after any <bos>)
    if first is None: continue
    ids = torch.tensor([[first] + body])
    st = tap.states(ids)[0]
    t = time.perf_counter(); r = engine.invert_prompt(st, ids[0].tolist()); dt = time.perf_counter() - t
    print(f"first {first} {lm.decode([first])!r}: {dt:.1f} s exact {r.exact} {r.status}, position 0 tried {r.positions[0].tried}", flush=True)
