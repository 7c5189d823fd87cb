"""The LM prior's screens (LinearRanker.prior_screens: the plain screen and the LM head's logits over the whole
vocabulary) of random-id rows like the fit's gate rows, in blocks of SCREEN_ROWS rows: 128 (the code's, chosen on
SmolLM2's 49,152-token vocabulary, where a [128, V] block stays in cache) against fewer for a 262,144-token one, whose
[128, V] blocks do not; seconds, and whether the outputs are the same. Gemma-3-270M's last layer, fast calibration.

    python screen_rows_gemma.py [ROWS]        e.g. 256 (rows of 20 random ids)"""
import sys
import time

import torch

import common  # noqa: F401  (2 threads)
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned import ranker as _ranker  # noqa: F401
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

R = sys.modules["sipit.invert.learned.ranker"]
lm = load_model("gemma3-270m")
layer = lm.n_layers
ranker = SipIt(lm, layer, InvertConfig(learned=calibration_config("fast")), eps=1e-4).policy.ranker
ids = torch.randint(lm.vocab_size, (int(sys.argv[1]) if len(sys.argv) > 1 else 256, 20),
                    generator=torch.Generator().manual_seed(1))
H = LayerTap(lm, layer).states(ids).float()
r, n = ranker.context_residuals(*H), ranker.normed(H[:, :-1]).reshape(-1, H.shape[-1]).float()
reference = None
for rows in (128, 64, 32, 16, 128, 64, 32, 16):
    R.SCREEN_ROWS = rows
    t = time.perf_counter()
    out = ranker.prior_screens(r, n)
    seconds = time.perf_counter() - t
    reference = reference or out
    print(f"{len(r)} positions, SCREEN_ROWS {rows:3d}: {seconds:.2f} s, the same: "
          f"{all(torch.equal(a, b) for a, b in zip(out, reference))}", flush=True)
