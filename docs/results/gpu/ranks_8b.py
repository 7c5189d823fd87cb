"""The CPU diagnostic behind this folder's README: where the learned ranker puts the true tokens of
random-id prompts for random:llama-3.1-8b (bf16) built up to layer 1, from a cached calibration.

    SIPIT_CACHE=DIR sipit bench invert --model random:llama-3.1-8b --precision bf16 --layers 1 \
        --kinds random --prompts 1 --policies learned --certify "" --batches "" --calibration fast
    SIPIT_CACHE=DIR python docs/results/gpu/ranks_8b.py      # (the bench may be stopped once calibrated)

Prints, per prompt (seed 5, 20 tokens), the true token's rank at position 0 and at positions 1..19
under the score 2 r·P_v − g‖P_v‖², and the mean whitened residual norms (≈ √d = 64 when the
calibration's noise model holds).
"""
import glob

import torch

from sipit.invert.learned.cache import Calibration
from sipit.models import LayerTap, load_model
from sipit.models.load import cache_dir

torch.set_num_threads(2)
lm = load_model("random:llama-3.1-8b", precision="bf16", max_layer=1)
tap = LayerTap(lm, 1)
cal = Calibration.load(sorted(glob.glob(str(cache_dir() / "learned" / "*-L1-*.safetensors")))[0], lm.device)
ids = torch.randint(0, lm.vocab_size, (2, 20), generator=torch.Generator().manual_seed(5))
for h, row in zip(tap.states(ids).float(), ids):
    r = h[1:] @ cal.white - h[:-1] @ cal.Bw - cal.cw  # context residuals [19, d]
    S = 2 * r @ cal.P.T - cal.gain * cal.P_sq  # [19, V]
    s0 = 2 * (h[:1] @ cal.white0 - cal.c0w) @ cal.p0.T - cal.gain0 * cal.p0_sq  # fast calibration: [1, V]
    print("position 0 rank", int((s0[0] > s0[0, row[0]]).sum()),
          "| positions 1..19 ranks", (S > S.gather(1, row[1:, None])).sum(1).tolist())
    print("whitened residual norm with the true token removed", round(float((r - cal.gain * cal.P[row[1:]]).norm(dim=1).mean()), 1),
          "| without", round(float(r.norm(dim=1).mean()), 1))
