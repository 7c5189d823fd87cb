"""Position 1's own residual statistics (an estimate, nothing inverted): the true token's rank at position 1 of
the bench prompts of fresh seeds by the calibration's scores (its whitening W, fitted over every position) against
the same scores whitened again by position 1's own residual covariance S1 (of r − P_x, W's space; offset μ1):
score(v) = 2 (r − μ1) S1⁻¹ P_v − g P_v S1⁻¹ P_vᵀ. S1 from two-token sequences (bigrams of the calibration text,
seeded; N = 0: the calibration rows' own position 1, 768 rows), shrunk toward I by α (S1 ← (1 − α) S1 + α I).
Position 1's context is the first token's state alone (a sink without a BOS), unlike every later position's.

    python position1_whitening.py LAYER SEEDS N,... ALPHA,... [SEED:PROMPT,...]   e.g. 30 331,337 0,2048,8192 0,0.5
The optional cases: the truth's rank at position 1 of those bench prompts under each setting (e.g. 311:25, whose
position 1 a search of this code reached after 21,584 candidates)."""
import sys
import time

import torch
from common import bench_prompts, position1

layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
sizes, alphas = [int(n) for n in sys.argv[3].split(",")], [float(a) for a in sys.argv[4].split(",")]
cases = [tuple(map(int, c.split(":"))) for c in sys.argv[5].split(",")] if len(sys.argv) > 5 else []
lm, tap, rk, ids, tests, truth, H0, H1 = position1(layer, seeds)
cal = rk.cal
r = H1 @ cal.white - H0 @ cal.Bw - cal.cw  # position 1's context residuals [n, d]
picked = [(seed, i, bench_prompts(lm, tap, seed)) for seed, i in cases]
case_truth = torch.tensor([int(p[i, 1]) for _, i, (_, p, _) in picked], dtype=torch.long)
case_r = torch.stack([st[i][1] @ cal.white - st[i][0] @ cal.Bw - cal.cw for _, i, (_, _, st) in picked]) if cases else r[:0]


def ranks(M: torch.Tensor, mu: torch.Tensor, r=r, truth=truth) -> torch.Tensor:
    """The truth's rank under whitening M [d, d] and offset mu [d], at the calibration's gain. [n]"""
    PM = cal.P @ M
    s = 2 * (r - mu) @ PM.T - cal.gain * (PM * cal.P).sum(1)
    return (s > s.gather(1, truth[:, None])).sum(1)


def show(name: str, rank: torch.Tensor) -> None:
    print(f"  {name:28s} top-1 {float((rank == 0).float().mean()):.3f}, rank ≥ 16 {float((rank >= 16).float().mean()):.3f}, "
          f"≥ 256 {float((rank >= 256).float().mean()):.3f} ({int((rank >= 256).sum())}), largest {int(rank.max())}", flush=True)
    if cases:
        print(f"  {'':28s} cases {[(f'{s}:{i}', lm.decode([int(v)]), int(k)) for (s, i, _), v, k in zip(picked, case_truth, rank_cases)]}")


d = cal.P.shape[1]
print(f"SmolLM2 layer {layer}, position 1 of {len(truth)} bench prompts (seeds {seeds}), gain {cal.gain}")
rank_cases = ranks(torch.eye(d), torch.zeros(d), case_r, case_truth)
show("the calibration's", ranks(torch.eye(d), torch.zeros(d)))
for n in sizes:
    g = torch.Generator().manual_seed(0)
    rows, cols = torch.randint(0, len(ids), (n,), generator=g), torch.randint(1, ids.shape[1] - 1, (n,), generator=g)
    pairs = torch.stack([ids[rows, cols], ids[rows, cols + 1]], 1) if n else ids[:, :2]
    t = time.perf_counter()
    H = torch.cat([tap.states(pairs[i:i + 256]).float() for i in range(0, len(pairs), 256)])  # [N, 2, d]
    seconds = time.perf_counter() - t
    e = (H[:, 1] @ cal.white - H[:, 0] @ cal.Bw - cal.cw - cal.P[pairs[:, 1]]).double()  # [N, d]
    S, mu = torch.cov(e.T), e.mean(0).float()
    for a in alphas:
        M = torch.linalg.inv((1 - a) * S + a * torch.eye(d, dtype=S.dtype)).float()
        rank_cases = ranks(M, mu, case_r, case_truth)
        show(f"S1 of {len(pairs)} ({seconds:.1f} s), α {a}", ranks(M, mu))
