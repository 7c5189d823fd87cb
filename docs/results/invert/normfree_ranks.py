"""The true token's rank at the deep positions of normfree_ab.py's seven prompts (layer 30) by the main scores
2g·P_v·y − g²‖P_v‖² (no prior, no anchors), without the norm term (2 P_v·y), by cosine to P_v, by the nearest
position-0 table row (distance, cosine), by cosine to the embedding rows, and by the LM's next-token scores; and how
long the truth's prediction is (the share of the vocabulary whose ‖P_v‖² is smaller).

    python normfree_ranks.py"""
from common import bench_prompts, ranker_at, smollm2

lm = smollm2()
tap, rk = ranker_at(lm, 30)
cal = rk.cal
table = cal.table.float()
table_dir, P_dir = table / table.norm(dim=1, keepdim=True), cal.P / cal.P.norm(dim=1, keepdim=True)
E = lm.embedding_rows().float()
E_dir = E / E.norm(dim=1, keepdim=True)
cases = {389: [(23, 5), (24, 1), (24, 2), (27, 1), (28, 2), (28, 16)], 293: [(1, 1), (26, 3), (28, 16)]}
for seed, chosen in cases.items():
    data, ids, states = bench_prompts(lm, tap, seed)
    for i, t in chosen:
        target, v = states[i], int(ids[i, t])
        h, r = target[t], rk.context_residuals(target[t - 1:t + 1])[0]
        ranks = {name: int((s > s[v]).sum()) for name, s in dict(
            main=rk.scores(target, t, False), no_norm=2 * r @ cal.P.T, cos_P=P_dir @ r,
            table_distance=-(table - h).norm(dim=1), table_cos=table_dir @ h, embedding_cos=E_dir @ h,
            lm=rk.lm_scores(target, t)).items()}
        longer = float((cal.P_sq < cal.P_sq[v]).float().mean())
        print(f"seed {seed} prompt {i} ({data[i][0]}) position {t} {lm.decode([v])!r}: ‖P_v‖² above {longer:.1%}; {ranks}",
              flush=True)
