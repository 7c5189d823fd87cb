"""Tried, not kept: at positions whose true token ranks 256th or deeper, the first N candidates' states through the
model (as a search would have them), then the truth's rank among the rest by the anchored ranking (scores with
anchors: a gain and an offset fitted on them) against that plus a ridge map from the candidates' embedding rows
to the anchored residuals (ridge weight a x the mean eigenvalue, a = 0.1, 1, 10).

    python local_fit.py LAYER SEEDS N        e.g. 30 293 336"""
import sys, torch
from common import bench_prompts, ranker_at, smollm2
layer, seeds, N = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
lm = smollm2()
tap, rk = ranker_at(lm, layer)
c, E = rk.cal, lm.embedding_rows().float()
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    for i, ((k, p), target) in enumerate(zip(data, states)):
        prior = rk.guesses([target])[0][1]
        for t in range(1, 20):
            truth = int(ids[i, t])
            s0 = rk.scores(target, t, prior)
            if int((s0 > s0[truth]).sum()) < 256: continue
            cand = s0.topk(N).indices
            prefix = tap.prefill(ids[i, :t])
            h = tap.extend(prefix, cand).float()
            anchors = (cand, h)
            sa = rk.scores(target, t, prior, anchors)
            sa[cand] = -float("inf")
            ra = int((sa > sa[truth]).sum())
            # local correction
            y_obs, s_gain = rk.anchored_residual(target, t, anchors)  # y = W ĥ_t − (Ȳ − s X̄)
            Y, X = h @ c.white, c.P[cand]
            b = Y.mean(0) - s_gain * X.mean(0)
            R = Y - b - s_gain * X
            F = E[cand] - E[cand].mean(0)
            out = [f"{k} p{i} t{t} {lm.decode([truth])!r} rank0 {int((s0 > s0[truth]).sum())} anchored {ra}"]
            G = F.T.double() @ F.double()
            for a in (0.1, 1.0, 10.0):
                lam = a * float(G.trace()) / G.shape[0]
                C = torch.linalg.solve(G + lam * torch.eye(G.shape[0], dtype=torch.float64), F.T.double() @ R.double()).float()
                pred = s_gain * c.P + (E - E[cand].mean(0)) @ C  # + b folded: y_obs = W ĥ − b
                sc = -((y_obs[None] - pred) ** 2).sum(1)
                if prior:
                    sc += 2 * c.lm_weight * rk.lm_scores(target, t)
                sc[cand] = -float("inf")
                out.append(f"a={a}: {int((sc > sc[truth]).sum())}")
            print("  ".join(out), flush=True)
