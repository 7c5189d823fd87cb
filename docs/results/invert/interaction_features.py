"""Does a token-pair interaction explain what the linear forward model misses? Fits the calibration residual
W h_t − ĥ_{t−1} Bw − cw − gain·P_{v_t} (calibration_ids, 49,152 tokens) by ridge on φ = the previous token's and the
token's normalised embeddings multiplied elementwise (MODE emb), the whitened previous state's (ctx) or both; then
re-ranks the screen's 64 best of the bench prompts with the corrected prediction (the true previous token: an upper
bound) and counts wrong first guesses.

    python interaction_features.py LAYER SEEDS [RIDGE] [emb|ctx|both]        e.g. 15 5 1.0 emb"""
import sys, time, torch
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.data import calibration_ids
from sipit.models import LayerTap, load_model
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]; lam = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
torch.set_num_threads(2)
lm = load_model("smollm2")
tap = LayerTap(lm, layer)
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=1e-4)
rk = eng.policy.ranker; cal = rk.cal; g = rk.gain
E = lm.embedding_rows().float()
En = E / E.norm(dim=1, keepdim=True)
MODE = sys.argv[4] if len(sys.argv) > 4 else "emb"
def phi(prev, v, ctx=None):  # [n] ids, [n, m] ids -> [n, m, d]
    if MODE == "ctx":
        c = ctx @ cal.white; c = c / c.norm(dim=1, keepdim=True)
        return c[:, None, :] * En[v] * 24.0
    if MODE == "both":
        c = ctx @ cal.white; c = c / c.norm(dim=1, keepdim=True)
        return torch.cat([c[:, None, :] * En[v] * 24.0, En[prev][:, None, :].expand(-1, v.shape[1], -1) * En[v] * 24.0], -1)
    return En[prev][:, None, :] * En[v] * 24.0
t0 = time.perf_counter()
ids = calibration_ids(lm, 49152, 64, 0.2)
X, Y = [], []
for chunk in ids.split(64):
    H = tap.states(chunk).float()  # [b, 64, d]
    for h, row in zip(H, chunk):
        r = rk.context_residuals(h)  # [63, d]
        e = r - g * cal.P[row[1:]]
        X.append(phi(row[:-1], row[1:, None], h[:-1])[:, 0]); Y.append(e)
X, Y = torch.cat(X).double(), torch.cat(Y).double()
print("data", X.shape, round(time.perf_counter() - t0, 1), "s")
mx, my = X.mean(0), Y.mean(0)
Xc, Yc = X - mx, Y - my
M = torch.linalg.solve(Xc.T @ Xc + lam * len(X) * 1e-3 * torch.eye(X.shape[1], dtype=torch.float64), Xc.T @ Yc)
res0 = (Yc ** 2).sum(); res1 = ((Yc - Xc @ M) ** 2).sum()
print("in-sample residual fraction explained", float(1 - res1 / res0))
M, mx, my = M.float(), mx.float(), my.float()
for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    P_ids = torch.tensor([p for _, p in data]); states = tap.states(P_ids)
    wrong0 = wrong1 = 0
    for p, s in zip(P_ids, states):
        s = s.float(); r = rk.context_residuals(s); top, sc = rk.screen_best(r)
        lg = rk.lens_logits(s[:-1], top)
        on = rk.lens_text_score(lg) > cal.lens_gate
        base = sc + (2 * cal.lm_weight * lg if on else 0)
        pred = g * cal.P[top] + (phi(p[:-1], top, s[:-1]) - mx) @ M + my  # [n, m, d]
        new = (-((r[:, None] - pred) ** 2).sum(-1) + (r ** 2).sum(-1, keepdim=True)) / g
        new = new + (2 * cal.lm_weight * lg if on else 0)
        truth = p[1:]
        wrong0 += int((top.gather(1, base.argmax(1, keepdim=True))[:, 0] != truth).sum())
        wrong1 += int((top.gather(1, new.argmax(1, keepdim=True))[:, 0] != truth).sum())
    print(f"seed {seed}: wrong first guesses {wrong0} -> {wrong1}")
