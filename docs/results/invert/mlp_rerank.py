"""Tried, not kept. Offline: would a trained non-linear correction re-rank layer-L guesses better? Train f = MLP([w_t, w_{t-1}]) so
that s0(v) + f·P_v picks the truth among the 64 best by s0 (the ranker's scores, prior as gated); count wrong
first guesses on bench seeds (positions 1..19).

    python mlp_rerank.py LAYER SEEDS ROWS        e.g. 30 683,691 384"""
import sys, time, torch
from common import smollm2, ranker_at, bench_prompts
from sipit.invert.learned.config import LearnedConfig
from sipit.invert.learned.data import calibration_ids, random_ids
torch.manual_seed(0)
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]
n_rows = int(sys.argv[3]); K = 64
lm = smollm2(); tap, rk = ranker_at(lm, layer); c = rk.cal
cfg = LearnedConfig()
n_tok = cfg.sizes(lm.d_model, lm.vocab_size)[0]
n_text = n_tok // cfg.seq_len
allrows = calibration_ids(lm, (n_text + n_rows) * cfg.seq_len, cfg.seq_len, 0.0)
text = allrows[n_text:n_text + n_rows]
rand = random_ids(lm.vocab_size, n_rows // 4, cfg.seq_len, seed=99)
t0 = time.time()
def examples(rows, prior):
    X, C, S, Y = [], [], [], []
    for b in rows.split(16):
        H = tap.states(b).float()
        for h, ids in zip(H, b):
            req = [(h, t, prior, None) for t in range(1, len(ids))]
            s = rk.scores_many(req, exact_top=K)  # [T-1, V]
            top = s.topk(K, dim=1)
            w = h @ c.white
            X.append(torch.cat([w[1:], w[:-1]], 1)); C.append(top.indices); S.append(top.values); Y.append(ids[1:])
    return torch.cat(X), torch.cat(C), torch.cat(S), torch.cat(Y)
prior_text = bool(c.has_prior)
tr = [examples(text, prior_text), examples(rand, False)]
X, C, S, Y = (torch.cat(z) for z in zip(*tr))
print(f"data {time.time()-t0:.0f}s N {len(Y)}; truth in top-{K}: {float((C == Y[:, None]).any(1).float().mean()):.3f}; "
      f"base top-1 right {float((C[:, 0] == Y).float().mean()):.3f}", flush=True)
keep = (C == Y[:, None]).any(1)
X, C, S, Y = X[keep], C[keep], S[keep], Y[keep]
lab = (C == Y[:, None]).float().argmax(1)
P = c.P.float()
mu, sd = X.mean(0), X.std(0) + 1e-6
sscale = float(S.std())
n = len(Y); perm = torch.randperm(n); va, trn = perm[: n // 7], perm[n // 7:]
d = P.shape[1]
def make(hidden):
    return torch.nn.Sequential(torch.nn.Linear(2 * d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d))
def logits(net, beta, idx):
    f = net((X[idx] - mu) / sd)  # [b, d]
    Pc = P[C[idx]]  # [b, K, d]
    return beta * S[idx] / sscale + (Pc @ f[:, :, None])[..., 0]
for hidden, wd in [(512, 1e-4), (1024, 1e-3)]:
    net = make(hidden); beta = torch.tensor(1.0, requires_grad=True)
    torch.nn.init.zeros_(net[2].weight); torch.nn.init.zeros_(net[2].bias)
    opt = torch.optim.AdamW(list(net.parameters()) + [beta], lr=1e-3, weight_decay=wd)
    best = (0, None)
    for ep in range(12):
        for b in trn[torch.randperm(len(trn))].split(256):
            loss = torch.nn.functional.cross_entropy(logits(net, beta, b), lab[b])
            opt.zero_grad(); loss.backward(); opt.step()
        with torch.no_grad():
            acc = float((logits(net, beta, va).argmax(1) == lab[va]).float().mean())
            base = float((S[va].argmax(1) == lab[va]).float().mean())
        print(f"hidden {hidden} wd {wd} epoch {ep}: val top-1 {acc:.3f} (base {base:.3f})", flush=True)
        if acc > best[0]:
            best = (acc, {k: v.clone() for k, v in net.state_dict().items()}, float(beta))
    net.load_state_dict(best[1]); bt = best[2]
    with torch.no_grad():
        for seed in seeds:
            data, ids, states = bench_prompts(lm, tap, seed)
            out = {}
            for (src, p), h in zip(data, states):
                g, prior = rk.guesses([h])[0]
                s = rk.scores_many([(h, t, prior, None) for t in range(1, 20)], exact_top=K)
                top = s.topk(K, dim=1)
                w = h @ c.white
                f = net((torch.cat([w[1:], w[:-1]], 1) - mu) / sd)
                lg = bt * top.values / sscale + (P[top.indices] @ f[:, :, None])[..., 0]
                new = top.indices.gather(1, lg.argmax(1, keepdim=True))[:, 0]
                truth = torch.tensor(p[1:])
                o = out.setdefault(src, [0, 0, 0])
                o[0] += int((g != truth).sum()); o[1] += int((top.indices[:, 0] != truth).sum()); o[2] += int((new != truth).sum())
            print(f"  seed {seed}: wrong of 190 per source (guesses / scores top-1 / re-ranked):",
                  {k: tuple(v) for k, v in out.items()}, flush=True)
