"""Does the NEXT observed state (h_{t+1}) tell which token sits at t (previous-token heads)? Fits ridge
P_{x_t} ≈ φ M + b on the calibration rows (φ = whitened h_{t+1} (next), or [h_t, h_{t+1}] whitened (both)), then
re-ranks the guesses' candidates (the screen's guess_top best) of the bench prompts by
score + β (2 ŷ·P_v − NORM·‖P_v‖²)/σ² (and the lens, as the guesses do); positions 1..T-2. Counts wrong first guesses.
    python next_state_features.py LAYER SEEDS BETAS [next|both] [RIDGE] [NORM]      e.g. 15 5 0.1,0.25 next 1.0 0"""
import sys, time, torch
from common import SOURCES, bench_prompts, ranker_at, smollm2
from sipit.invert.learned.data import calibration_ids
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]
betas = [float(b) for b in sys.argv[3].split(",")]
MODE = sys.argv[4] if len(sys.argv) > 4 else "next"; lam = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0; NORM = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
lm = smollm2(); tap, rk = ranker_at(lm, layer); cal = rk.cal; g = rk.gain
def phi(H):  # H [T, d] -> features of positions 1..T-2 [T-2, ·]
    w = H.float() @ cal.white
    return w[2:] if MODE == "next" else torch.cat([w[1:-1], w[2:]], 1)
t0 = time.perf_counter()
ids = calibration_ids(lm, 49152, 64, 0.2)
X, Y = [], []
for chunk in ids.split(64):
    H = tap.states(chunk).float()
    for h, row in zip(H, chunk):
        X.append(phi(h)); Y.append(cal.P[row[1:-1]].float())
X, Y = torch.cat(X).double(), torch.cat(Y).double()
mx, my = X.mean(0), Y.mean(0); Xc, Yc = X - mx, Y - my
M = torch.linalg.solve(Xc.T @ Xc + lam * len(X) * 1e-3 * torch.eye(X.shape[1], dtype=torch.float64), Xc.T @ Yc)
R = Yc - Xc @ M
sig2 = float((R ** 2).mean()); print("data", X.shape, "R2", float(1 - (R ** 2).sum() / (Yc ** 2).sum()), "sigma2", sig2,
      round(time.perf_counter() - t0, 1), "s", flush=True)
M, mx, my = M.float(), mx.float(), my.float()
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    wrong = {b: [0, 0, 0, 0] for b in betas}
    for (kind, _), p, s in zip(data, ids, states):
        r = rk.context_residuals(s); top, sc = rk.screen_best(r)
        lg = rk.lens_logits(s[:-1], top)
        on = rk.lens_text_score(lg) > cal.lens_gate
        base = sc + (2 * cal.lm_weight * lg if on else 0)
        yhat = (phi(s) - mx) @ M + my  # [T-2, d] for positions 1..T-2
        Pv = cal.P[top[:-1]].float()  # [T-2, m, d]
        nxt = (2 * (Pv * yhat[:, None]).sum(-1) - NORM * (Pv ** 2).sum(-1)) / sig2  # [T-2, m]
        truth = p[1:]
        for b in betas:
            sc2 = base.clone(); sc2[:-1] += b * nxt
            wrong[b][SOURCES.index(kind)] += int((top.gather(1, sc2.argmax(1, keepdim=True))[:, 0] != truth).sum())
    for b in betas:
        print(f"seed {seed} beta {b}: wrong first guesses {sum(wrong[b])} (prose/code/random/chat {wrong[b]})", flush=True)
