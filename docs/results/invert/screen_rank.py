"""The rank the fit's agreement rule chooses for P's screen (fit._screening), per layer: the screened top-1 (the
screen's best M scored exactly: the fit's M is LearnedConfig.screen_top with a lens, else guess_top) against full scoring on
the fit's own validation rows, at ranks 16..512 of P's principal subspace.
    python screen_rank.py LAYERS M        e.g. 1,15,30 16"""
import sys, copy, torch
from common import ranker_at, smollm2
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.data import calibration_ids
from sipit.invert.learned.fit import VALIDATION_LEN, _principal_basis
from sipit.invert.learned.ranker import LinearRanker
lm = smollm2(); cfg = calibration_config("full"); M = int(sys.argv[2])
val = calibration_ids(lm, cfg.validation_rows * cfg.seq_len, cfg.seq_len, cfg.random_fraction, seed=1)[:, :VALIDATION_LEN]
for layer in [int(x) for x in sys.argv[1].split(",")]:
    tap, rk = ranker_at(lm, layer); cal = rk.cal
    r = rk.context_residuals(*tap.states(val).float())
    full = (2 * r @ cal.P.T - cal.gain * cal.P_sq).argmax(1)
    basis = _principal_basis(cal.P, cal.P.shape[1]).float()
    out = []
    for k in (16, 32, 64, 128, 256, 512):
        c = copy.copy(cal); c.p_basis = basis[:, :k].contiguous(); c.p_proj = cal.P.float() @ c.p_basis
        s = LinearRanker(c, tap, M, torch.float32, guess_top=M).screen(r)
        out.append(f"{k}: {int((s == full).sum())}/{len(full)}")
    print(f"layer {layer} (calibrated rank {cal.p_basis.shape[1]}):", "  ".join(out), flush=True)
