"""P's screen, two ways, in P's principal subspace Π of rank k (all of P's directions, largest first): the projected
dot product less the FULL norm, 2 r·ΠP_v − g‖P_v‖² (the screens until 692fd15), against the projected distance,
2 r·ΠP_v − g‖ΠP_v‖² (since). Prints at how many positions of the bench prompts the exact top-1 (full scoring) is
among each screen's best m.
    python screen_norm.py LAYER SEEDS        e.g. 1 5"""
import sys, torch
from common import bench_prompts, ranker_at, smollm2
from sipit.invert.learned.fit import _principal_basis
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]
lm = smollm2(); tap, rk = ranker_at(lm, layer); cal = rk.cal; g = rk.gain
P = cal.P.float(); print("layer", layer, "p_basis", tuple(cal.p_basis.shape), "gain", g)
basis = _principal_basis(P, P.shape[1]).float()
for seed in seeds:
    data, tids, states = bench_prompts(lm, tap, seed)
    r = rk.context_residuals(*states); truth = tids[:, 1:].reshape(-1)
    exact = (2 * r @ P.T - g * cal.P_sq).argmax(1)
    print(f"seed {seed}: exact top-1 right {int((exact == truth).sum())}/{len(truth)}")
    for k in (16, 32, 64, 128, 256):
        B = basis[:, :k]; Pk = P @ B; rk_ = r @ B
        dot = 2 * rk_ @ Pk.T
        for name, s in (("full-norm", dot - g * cal.P_sq), ("proj-norm", dot - g * (Pk ** 2).sum(1))):
            row = []
            for m in (1, 4, 16, 64):
                top = s.topk(m).indices
                row.append(f"m{m} {int((top == exact[:, None]).any(1).sum())}")
            print(f"  k {k:3d} {name}: " + "  ".join(row))
