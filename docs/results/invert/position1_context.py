"""Position 1's own context model (an estimate, nothing inverted): the true token's rank at position 1 of the bench
prompts of fresh seeds by the calibration's scores, whose context part ĥ_0 Bw + cw is fitted over every position,
against the same scores with position 1's own B1, c1: r_1 = ĥ_1 W − ĥ_0 B1 − c1, ridge-fitted on N two-token
sequences (bigrams of the calibration text and its random-id rows, seeded) to ĥ_1 W − g·P_{x_1}; the ridge λ (a
multiple of XᵀX's mean diagonal) chosen by the error on a fifth of the pairs held out, never on the prompts.
Position 1's context is the first token's state alone (a sink without a BOS), unlike every later position's.

    python position1_context.py LAYER SEEDS N        e.g. 30 449,457 8192"""
import sys
import time

import torch
from common import position1

layer, seeds, N = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
lm, tap, rk, ids, tests, truth, H0, H1 = position1(layer, seeds)
cal = rk.cal


def ranks(r: torch.Tensor) -> torch.Tensor:
    """The truth's rank at residuals r [n, d] by 2 r·P_v − g‖P_v‖². [n]"""
    s = 2 * r @ cal.P.T - cal.gain * cal.P_sq
    return (s > s.gather(1, truth[:, None])).sum(1)


def show(name: str, rank: torch.Tensor) -> None:
    print(f"  {name:44s} top-1 {float((rank == 0).float().mean()):.3f}, rank ≥ 16 {float((rank >= 16).float().mean()):.3f}, "
          f"≥ 256 {float((rank >= 256).float().mean()):.3f} ({int((rank >= 256).sum())}), median of the misses "
          f"{int(rank[rank > 0].median()) if (rank > 0).any() else 0}, largest {int(rank.max())}", flush=True)


print(f"SmolLM2 layer {layer}, position 1 of {len(truth)} bench prompts (seeds {seeds}), gain {cal.gain}")
show("the calibration's (ĥ_0 Bw + cw)", ranks(H1 @ cal.white - H0 @ cal.Bw - cal.cw))
g = torch.Generator().manual_seed(0)
rows, cols = torch.randint(0, len(ids), (N,), generator=g), torch.randint(0, ids.shape[1] - 1, (N,), generator=g)
pairs = torch.stack([ids[rows, cols], ids[rows, cols + 1]], 1)
t = time.perf_counter()
H = torch.cat([tap.states(pairs[i:i + 256]).float() for i in range(0, len(pairs), 256)])  # [N, 2, d]
seconds = time.perf_counter() - t
X = torch.cat([H[:, 0], torch.ones(N, 1)], 1).double()  # [N, d + 1]
Y = (H[:, 1] @ cal.white - cal.gain * cal.P[pairs[:, 1]]).double()  # [N, d]
fit, held = slice(0, N * 4 // 5), slice(N * 4 // 5, N)


def ridge(X, Y, lam):
    A = X.T @ X
    return torch.linalg.solve(A + lam * A.diagonal().mean() * torch.eye(len(A), dtype=A.dtype), X.T @ Y)


errors = {lam: float(((X[held] @ ridge(X[fit], Y[fit], lam) - Y[held]) ** 2).sum()) for lam in (1e-4, 1e-3, 1e-2, 1e-1, 1.0)}
lam = min(errors, key=errors.get)
base = float(((X[held, :-1].float() @ cal.Bw + cal.cw - Y[held].float()) ** 2).sum())
print(f"  held-out pairs' squared error: calibration's {base:.4g}; own, by λ {({k: f'{v:.4g}' for k, v in errors.items()})}")
Bc = ridge(X, Y, lam).float()
show(f"own B1, c1 ({N} pairs, {seconds:.1f} s of states, λ {lam:g})", ranks(H1 @ cal.white - torch.cat([H0, torch.ones(len(H0), 1)], 1) @ Bc))
