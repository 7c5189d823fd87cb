"""How a calibration's screen of each rank does against full scoring on the fit's own validation rows: positions
where the screen's pick scores lower than full scoring's top-1 (what the rank search judged before VERSION 12),
those of them where full scoring was right (what it judges now: fit._agreement), and each one's right guesses.
Reads the calibration from the cache (fitting it if absent); its P does not depend on the rank kept.
    python screen_agreement.py LAYER [MODE] [MODEL]      e.g. 15 fast smollm2"""
import sys

import torch

from sipit.invert.learned import LearnedConfig, LinearRanker, load_or_calibrate
from sipit.invert.learned.data import calibration_ids
from sipit.models import LayerTap, load_model

fit = sys.modules["sipit.invert.learned.fit"]
layer = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "fast"
lm = load_model(sys.argv[3] if len(sys.argv) > 3 else "smollm2")
cfg = LearnedConfig.fast() if mode == "fast" else LearnedConfig()
tap = LayerTap(lm, layer)
cal, _ = load_or_calibrate(tap, cfg)
val = calibration_ids(lm, cfg.validation_rows * cfg.seq_len, cfg.seq_len, cfg.random_fraction, seed=1)
val = val[:, :fit.VALIDATION_LEN]  # (as fit_calibrations draws them)
H = tap.states(val).float()
r = (H[:, 1:] @ cal.white - H[:, :-1] @ cal.Bw - cal.cw).reshape(-1, cal.P.shape[1])
truth = val[:, 1:].reshape(-1)
full = (2 * r @ cal.P.T - cal.gain * cal.P_sq).argmax(1)
basis = fit._principal_basis(cal.P, cal.P.shape[1]).float()
ranker = LinearRanker(cal, tap, cfg.screen_top, torch.float32, guess_top=cfg.guess_top)
print(f"{lm.name} L{layer} {mode}: kept rank {cal.p_basis.shape[1]}; full scoring right at {int((full == truth).sum())} "
      f"of {len(truth)} validation positions")
rank = cfg.screen_rank
while rank <= cal.P.shape[1]:
    cal.p_basis = basis[:, :rank].contiguous()
    cal.p_proj = cal.P.float() @ cal.p_basis
    ranker.use_screen()
    picks = ranker.screen(r)
    lower = ranker.exact_scores(picks[:, None], r, cal.gain)[:, 0] < ranker.exact_scores(full[:, None], r, cal.gain)[:, 0]
    print(f"rank {rank:4d}: scores lower {int(lower.sum()):4d}, of them where full scoring is right "
          f"{int((lower & (full == truth)).sum()):4d}; right {int((picks == truth).sum())}")
    rank *= 2
