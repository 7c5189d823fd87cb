"""Which validation positions a screen of each rank "disagrees" at, and by how much: SmolLM2's full calibration at a
layer (from the cache), its 608 validation positions as the fit makes them, full scoring's top-1 against the screen's
pick at ranks 16-512 (the principal basis of P, as fit._screening makes it). Prints the stored rank, then per rank the
disagreeing positions as (position, full's pick, the screen's pick, the true token, full's score minus the pick's).
    python screen_rank_ties.py LAYER      e.g. 1"""
import sys

from common import ranker_at, smollm2

from sipit.invert.learned import fit
from sipit.invert.learned.config import LearnedConfig
from sipit.invert.learned.data import calibration_ids

layer = int(sys.argv[1])
lm = smollm2()
tap, rk = ranker_at(lm, layer)
cfg, cal = LearnedConfig(), rk.cal
val = calibration_ids(lm, cfg.validation_rows * cfg.seq_len, cfg.seq_len, cfg.random_fraction, seed=1)
val = val[:, :fit.VALIDATION_LEN]
H = tap.states(val).float()
r = rk.context_residuals(*H)  # [32 · 19, d]
truth = val[:, 1:].reshape(-1)
S = 2 * r @ cal.P.T - cal.gain * cal.P_sq
full = S.argmax(1)
print(f"layer {layer}: stored screen rank {cal.p_basis.shape[1]}, gain {cal.gain}, full top-1 right "
      f"{int((full == truth).sum())} of {len(truth)}")
basis = fit._principal_basis(cal.P, cal.P.shape[1]).float()
ranker = fit._ranker(cal, tap, cfg)
for rank in (16, 32, 64, 128, 256, 512):
    cal.p_basis = basis[:, :rank].contiguous()
    cal.p_proj = cal.P.float() @ cal.p_basis
    ranker.use_screen()
    pick = ranker.screen(r)
    bad = (pick != full).nonzero()[:, 0]
    print(rank, "disagree", len(bad), [(int(i), int(full[i]), int(pick[i]), int(truth[i]), float(S[i, full[i]] - S[i, pick[i]]))
                                       for i in bad[:5]])
