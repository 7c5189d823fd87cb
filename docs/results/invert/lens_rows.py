"""Would a lens fitted on more rows (or a different weight) fix more wrong first guesses at layer L? Fits the
ridge lens h_last ≈ ĥ W + b on the first N text rows of the calibration corpus for each N, then re-ranks the
guesses' candidates (the screen's guess_top best) of the bench prompts by score + 2 w (lens logit), the gate as calibrated; 'oracle' reads the
true prompt's own last-layer states (an upper bound).
    python lens_rows.py LAYER SEEDS ROWS WEIGHTS      e.g. 15 5 256,1024,2048 2.5,5,10"""
import sys, time, torch
from common import bench_prompts, ranker_at, smollm2
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.data import calibration_ids
from sipit.invert.learned.fit import Moments
from sipit.models import LayerTap
from sipit.models.tap import run_taps
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]
rows_list = [int(x) for x in sys.argv[3].split(",")]; weights = [float(x) for x in sys.argv[4].split(",")]
lm = smollm2(); tap, rk = ranker_at(lm, layer); last = LayerTap(lm, lm.depth)
cfg = calibration_config("full"); cal = rk.cal
ids = calibration_ids(lm, 64 * max(rows_list) * 2, 64, 0.0)[:max(rows_list)]
lenses, m, t0 = {}, Moments(), time.perf_counter()
with torch.no_grad():
    for i in range(0, len(ids), 16):
        h, hl = [x.float() for x in run_taps(lm, [tap, last], ids[i:i + 16])]
        m.add(h.reshape(-1, h.shape[-1]), hl.reshape(-1, hl.shape[-1]))
        if i + 16 in rows_list:
            Ws, mx, my, _ = m.ridge(cfg.ridge); lenses[i + 16] = (Ws.float(), (my - mx @ Ws).float())
            print("lens", i + 16, "rows", round(time.perf_counter() - t0, 1), "s", flush=True)
lenses["cal"] = (cal.lens_w, cal.lens_b)
U = rk.unembed
for seed in seeds:
    _, tids, _ = bench_prompts(lm, tap, seed)
    with torch.no_grad():
        S, SL = [x.float() for x in run_taps(lm, [tap, last], tids)]
    for name in ["plain", "cal", *rows_list, "oracle"]:
        for w in ([0] if name == "plain" else weights):
            wrong, none = 0, 0
            for p, s, sl in zip(tids, S, SL):
                r = rk.context_residuals(s); top, sc = rk.screen_best(r)
                if name == "plain":
                    g = top[:, 0]
                else:
                    n = lm.norm(sl[:-1]) if name == "oracle" else lm.norm(s[:-1] @ lenses[name][0] + lenses[name][1])
                    lg = torch.stack([U[t] @ x for t, x in zip(top, n.float())])
                    on = rk.lens_text_score(lg) > cal.lens_gate
                    g = top.gather(1, (sc + 2 * w * lg).argmax(1, keepdim=True))[:, 0] if on else top[:, 0]
                k = int((g != p[1:]).sum()); wrong += k; none += k == 0
            print(f"seed {seed} lens {name} w {w}: wrong {wrong} of 760, prompts with none {none}/40", flush=True)
