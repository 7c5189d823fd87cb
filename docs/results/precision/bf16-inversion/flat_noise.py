"""Why a 16-bit model's lock-step requests never share a flat pass (models/tap.py, bfc61f4): position 1 after each of
eps.py's common first tokens (sink_pairs), on the prefix a lock-step pass of every pair leaves, recomputed in a flat
pass (tap._extend_flat, called directly: extend_many no longer makes one for a 16-bit model) of the pair alone, of 2,
8, 13 and all 24 pairs, and in a padded pass of all; relative to one full forward of the pairs. Largest and median over
the pairs in the pass, for SmolLM2 in bfloat16 and in float32.

    python flat_noise.py LAYER        e.g. 15"""
import sys

import torch

from sipit.invert.eps import sink_pairs
from sipit.invert.verify import rel_distance
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
layer = int(sys.argv[1])
for precision in ("bf16", "fp32"):
    lm = load_model("smollm2", precision=precision)
    g = torch.Generator().manual_seed(0)
    torch.randint(lm.vocab_size, (2, 24), generator=g)  # (as measure_noise draws before the pairs)
    pairs = sink_pairs(lm, g)
    tap = LayerTap(lm, layer)
    ref = tap.states(pairs)  # [n, 2, d]
    _, grown = tap.extend(tap.prefill(pairs[:0, 0]), pairs, keep=True)
    prefixes = [grown(b, 1) for b in range(len(pairs))]
    n = len(pairs)
    for name, sel in (("flat, alone", [12]), ("flat, 2", [11, 12]), ("flat, 8", list(range(8, 16))),
                      ("flat, 13", list(range(13))), (f"flat, {n}", list(range(n))), (f"padded, {n}", list(range(n)))):
        run = tap._extend_padded if name.startswith("padded") and len(sel) > 1 else tap._extend_flat
        answers = run([(prefixes[b], pairs[b][None, 1:]) for b in sel])
        errs = [float(rel_distance(h[0, 0], ref[b, 1])) for (h, _), b in zip(answers, sel)]
        worst = max(range(len(errs)), key=errs.__getitem__)
        print(f"{precision} layer {layer}, {name:11s}: largest {max(errs):.3g} (after "
              f"{lm.decode(pairs[sel[worst], :1].tolist())!r}), median {sorted(errs)[len(errs) // 2]:.3g}", flush=True)
