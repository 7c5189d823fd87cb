"""Which validation positions a screen of each rank "disagrees" at, and by how much: SmolLM2's calibration (full or
fast) at a layer (from the cache), its 608 validation positions as the fit makes them, full scoring's top-1 against the
screen's pick at ranks 16-512 (the principal basis of P, as fit._screening makes it). Prints the stored rank, then per
rank the disagreeing positions as (position, full's pick, the screen's pick, the true token, full's score minus the
pick's), and how many picks score lower than full scoring's: all (the rank search's rule before VERSION 12) and where
full scoring is right (its rule since: fit._agreement), with the screen's right picks.
    python screen_rank_ties.py LAYER [MODE]      e.g. 1, or 15 fast"""
import sys

from common import ranker_at, smollm2, with_screen_rank

from sipit.invert.learned import fit
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.data import calibration_ids

layer = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "full"
lm = smollm2()
tap, rk = ranker_at(lm, layer, mode)
cfg, cal = calibration_config(mode), rk.cal
val = calibration_ids(lm, cfg.validation_rows * cfg.seq_len, cfg.seq_len, cfg.random_fraction, seed=1)
val = val[:, :fit.VALIDATION_LEN]
H = tap.states(val).float()
r = rk.context_residuals(*H)  # [32 · 19, d]
truth = val[:, 1:].reshape(-1)
S = 2 * r @ cal.P.T - cal.gain * cal.P_sq
full = S.argmax(1)
print(f"layer {layer} {mode}: stored screen rank {cal.p_basis.shape[1]}, gain {cal.gain}, full top-1 right "
      f"{int((full == truth).sum())} of {len(truth)}")
basis = fit._principal_basis(cal.P, cal.P.shape[1]).float()
ranker = fit._ranker(cal, tap, cfg)
exact = lambda ids: ranker.exact_scores(ids[:, None], r, cal.gain)[:, 0]  # (as the fit compares them)
for rank in (16, 32, 64, 128, 256, 512):
    with_screen_rank(ranker, basis, rank)
    pick = ranker.screen(r)
    bad = (pick != full).nonzero()[:, 0]
    lower = exact(pick) < exact(full)
    print(rank, "disagree", len(bad), [(int(i), int(full[i]), int(pick[i]), int(truth[i]), float(S[i, full[i]] - S[i, pick[i]]))
                                       for i in bad[:5]],
          f"scores lower {int(lower.sum())}, where full scoring is right {int((lower & (full == truth)).sum())}, "
          f"right {int((pick == truth).sum())}")
