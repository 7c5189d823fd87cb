"""A search's re-ranking from anchors, with a kernel-ridge correction (an estimate, nothing inverted). At positions of
the bench prompts (10 a source, 20 tokens) whose true token the main scores (no anchors) rank 16th or deeper, the
first K tokens of that ranking (the truth left out) are evaluated exactly on the true prefix, as a search's first
batch would be; then the truth's rank among the tokens not yet tried: by the main scores, by the anchored scores the
loop uses (ranker.anchored_residual: W h_t(u) ≈ b + s·P_u fitted on the anchors), and by the same plus what the
anchors' residuals R_u = W h_t(u) − b − s·P_u say of every other token through a linear kernel on the token
predictions, (P_v − P̄)·(P_u − P̄), ridge-regressed (λ: a multiple of the kernel's mean diagonal).

    python anchor_kernel.py LAYER SEEDS K LAMBDAS        e.g. 30 1013,1019 16 0.01,0.1,1"""
import sys

import torch
from common import bench_prompts, ranker_at, smollm2

layer, seeds, K = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
lambdas = [float(x) for x in sys.argv[4].split(",")]
torch.set_num_threads(2)
lm = smollm2()
tap, ranker = ranker_at(lm, layer)
cal = ranker.cal


def rank(scores, v, tried):
    """The truth v's rank by scores [V] among the tokens not in tried."""
    scores = scores.clone()
    scores[tried] = -float("inf")
    return int((scores > scores[v]).sum())


print(f"# python anchor_kernel.py {layer} {sys.argv[2]} {K} {sys.argv[4]} (SmolLM2, full calibration)")
for seed in seeds:
    ranks = {"main": [], "anchored": [], **{f"kernel λ={lam:g}": [] for lam in lambdas}}
    data, ids, states = bench_prompts(lm, tap, seed)
    for row, target, (_, prior) in zip(ids, states, ranker.guesses(states)):
        for t in range(1, len(row)):
            v = int(row[t])
            main = ranker.scores(target, t, prior)
            if rank(main, v, []) < 16:
                continue
            tried = main.topk(K + 1).indices
            tried = tried[tried != v][:K]
            with torch.inference_mode():
                h = tap.extend(tap.prefill(row[:t]), tried).float()  # [K, d]: exact states on the true prefix
            anchors = (tried, h)
            anchored = ranker.scores(target, t, prior, anchors)
            ranks["main"].append(rank(main, v, tried))
            ranks["anchored"].append(rank(anchored, v, tried))
            y, s = ranker.anchored_residual(target, t, anchors)  # anchored = ‖y‖² − ‖y − s·P_v‖² (+ the prior)
            X, Y = cal.P[tried], h @ cal.white
            Xc = X - X.mean(0)
            R = (Y - Y.mean(0)) - s * Xc  # [K, d]: what the anchored fit leaves unexplained
            G = Xc @ Xc.T  # [K, K]
            kernel = (cal.P - X.mean(0)) @ Xc.T  # [V, K]
            prior_part = anchored - ranker.scores(target, t, False, anchors)
            for lam in lambdas:
                A = torch.linalg.solve(G + lam * G.diagonal().mean() * torch.eye(K), R)  # [K, d]
                corrected = -((y - s * cal.P - kernel @ A) ** 2).sum(1) + prior_part
                ranks[f"kernel λ={lam:g}"].append(rank(corrected, v, tried))
    for name, r in ranks.items():
        r = torch.tensor(r).float()
        print(f"seed {seed}, {len(r)} positions, {name:14s}: median rank {r.median():.0f}, < 16: {int((r < 16).sum())}, "
              f"≥ 80: {int((r >= 80).sum())}, mean log2(1 + rank) {float(torch.log2(1 + r).mean()):.2f}", flush=True)
