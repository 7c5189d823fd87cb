"""Why a fast calibration keeps its first tokens' states from the model itself (fit.first_token_rows): the position-0
states of the tokens it keeps, at each layer, how close the closest two are (relative to the state's norm; the radius
within which an observation guesses a kept token is half its nearest other's distance) against how far a bfloat16
copy of the model (the one the rest of a fast fit runs) puts them.

    python first_token_near.py MODEL LAYERS        e.g. smollm2 1,15,30"""
import sys

import torch

torch.set_num_threads(2)
from sipit.invert.learned.config import LearnedConfig
from sipit.invert.learned.data import calibration_ids
from sipit.invert.learned.fit import first_tokens
from sipit.models import LayerTap, load_model
from sipit.models.device import screen_dtype
from sipit.models.tap import run_taps

model, layers = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
lm = load_model(model)
cfg = LearnedConfig.fast()
first = first_tokens(lm, calibration_ids(lm, cfg.calibration_tokens, cfg.seq_len, cfg.random_fraction), cfg.first_tokens)
taps = [LayerTap(lm, layer) for layer in layers]
low = lm.copy_in(screen_dtype(lm.device))


def states(runner):
    return [torch.cat(x)[:, 0].double() for x in zip(*(run_taps(runner, taps, v[:, None]) for v in first.split(256)))]


print(f"# python first_token_near.py {' '.join(sys.argv[1:])}: {lm.name}, {len(first)} kept first tokens, "
      f"a {screen_dtype(lm.device)} copy")
for layer, X, Xl in zip(layers, states(lm), states(low)):
    norm = X.norm(dim=1)
    nearest = (torch.cdist(X, X).fill_diagonal_(float("inf")).min(1).values / norm)  # [n]
    err = (Xl - X).norm(dim=1) / norm
    print(f"layer {layer}: nearest other, relative: min {float(nearest.min()):.3g}, median {float(nearest.median()):.3g}; "
          f"the copy's error: median {float(err.median()):.3g}, max {float(err.max()):.3g}; "
          f"kept states within the copy's error of their nearest other's half: {int((err >= nearest / 2).sum())}")
