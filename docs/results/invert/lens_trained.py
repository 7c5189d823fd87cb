"""A lens trained on the true next token among the screen's best (cross-entropy of the combined score: the linear
scores plus the lens weight times the lens logits; W, b, the weight and a temperature by Adam from the ridge lens,
L2 to it), on calibration text rows the fit did not use, 85/15 train/validation; then the wrong first guesses of the
bench prompts with no lens, the calibration's ridge lens and the trained one (each with its own gate, placed as
_lens_gate places it). Nothing inverted.

    python lens_trained.py LAYER SEEDS [ROWS STEPS LR DECAY]        e.g. 15 17,71,73 384 300"""
import sys, time, torch
from common import bench_prompts, ranker_at, smollm2
from sipit.invert.learned.config import LearnedConfig
from sipit.invert.learned.data import calibration_ids, random_ids
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]
n_rows = int(sys.argv[3]) if len(sys.argv) > 3 else 384
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 300
lm = smollm2(); tap, rk = ranker_at(lm, layer); c = rk.cal
cfg = LearnedConfig()
n_tok = cfg.sizes(lm.d_model, lm.vocab_size)[0]
n_rand = int(n_tok * cfg.random_fraction) // cfg.seq_len
n_text = n_tok // cfg.seq_len - n_rand
allrows = calibration_ids(lm, (n_text + n_rows) * cfg.seq_len, cfg.seq_len, 0.0)
train = allrows[n_text:n_text + n_rows]
print(f"layer {layer}: fit used {n_text} text rows; training on the next {len(train)}", flush=True)
t0 = time.time()
H = torch.cat([tap.states(b).float() for b in train.split(32)])  # [R, S, d]
Hs = list(H)
r = rk.context_residuals(*Hs)
top, sc = rk.screen_best(r)  # [N, 64]
prev = torch.cat([h[:-1] for h in Hs]); truth = train[:, 1:].reshape(-1)
hit = (top == truth[:, None])
keep = hit.any(1)
print(f"states+screen {time.time()-t0:.1f}s; truth in screen {float(keep.float().mean()):.4f}; N {len(truth)}", flush=True)
U = rk.unembed
def lens_logits(W, b, prev, top):
    n = lm.norm(prev @ W + b).float()
    return (U[top] * n[:, None]).sum(-1)
W = c.lens_w.clone().requires_grad_(); b = c.lens_b.clone().requires_grad_()
logw = torch.tensor(float(torch.log(torch.tensor(2 * c.lm_weight))), requires_grad=True)
beta = torch.tensor(0.0, requires_grad=True)  # log temperature of the CE
W0, b0 = c.lens_w.clone(), c.lens_b.clone()
idx = keep.nonzero()[:, 0]
P_, T_, S_, Y_ = prev[idx], top[idx], sc[idx], hit[idx].float().argmax(1)
ntr = int(0.85 * len(idx)); perm = torch.randperm(len(idx), generator=torch.Generator().manual_seed(0))
tr, va = perm[:ntr], perm[ntr:]
opt = torch.optim.Adam([W, b, logw, beta], lr=float(sys.argv[5]) if len(sys.argv) > 5 else 1e-3)
decay = float(sys.argv[6]) if len(sys.argv) > 6 else 1e-2
def loss_on(sel, grad=True):
    lg = lens_logits(W, b, P_[sel], T_[sel])
    z = (S_[sel] + logw.exp() * lg) * beta.exp()
    return torch.nn.functional.cross_entropy(z, Y_[sel]), (z.argmax(1) == Y_[sel]).float().mean()
with torch.no_grad():
    l, a = loss_on(va); print(f"start: val loss {float(l):.4f} acc {float(a):.4f}", flush=True)
g = torch.Generator().manual_seed(1)
best = (1e9, None)
for step in range(steps):
    sel = tr[torch.randint(0, len(tr), (512,), generator=g)]
    l, _ = loss_on(sel)
    reg = decay * (((W - W0) ** 2).sum() + ((b - b0) ** 2).sum())
    opt.zero_grad(); (l + reg).backward(); opt.step()
    if step % 25 == 24 or step == steps - 1:
        with torch.no_grad():
            lv, av = loss_on(va)
        print(f"step {step+1}: train {float(l):.4f} val loss {float(lv):.4f} acc {float(av):.4f} w/2 {float(logw.exp())/2:.2f} beta {float(beta.exp()):.3f}", flush=True)
        if float(lv) < best[0]:
            best = (float(lv), (W.detach().clone(), b.detach().clone(), float(logw.exp())))
print(f"trained in {time.time()-t0:.1f}s")
Wt, bt, wt = best[1]
# gates, as _lens_gate places them: on fresh random-id rows
from sipit.invert.learned.fit import _above_random
Hg = [h.float() for h in tap.states(random_ids(lm.vocab_size, cfg.gate_rows, 20, seed=2))]
rg = rk.context_residuals(*Hg); tg, _ = rk.screen_best(rg); pg = torch.cat([h[:-1] for h in Hg])
def text_scores(W, b, prev, top, sizes):
    with torch.no_grad():
        lg = lens_logits(W, b, prev, top)
    return [rk.lens_text_score(x) for x in lg.split(sizes)], lg
sizes_g = [19] * len(Hg)
gate_old = c.lens_gate
gate_new = _above_random(text_scores(Wt, bt, pg, tg, sizes_g)[0], cfg)
print(f"gates: ridge lens {gate_old:.2f}, trained {gate_new:.2f}")
tot = {}
for seed in seeds:
    data, ids, states = bench_prompts(lm, tap, seed)
    for (kind, p), s in zip(data, states):
        rr = rk.context_residuals(s); tp, scs = rk.screen_best(rr)
        truth = torch.tensor(p[1:])
        for name, (W_, b_, w_, gate) in {"none": (None, None, 0, 0), "ridge": (c.lens_w, c.lens_b, 2 * c.lm_weight, gate_old),
                                        "trained": (Wt, bt, wt, gate_new)}.items():
            if W_ is None:
                g_ = tp[:, 0]
            else:
                with torch.no_grad():
                    lg = lens_logits(W_, b_, s[:-1], tp)
                on = rk.lens_text_score(lg) > gate
                g_ = tp.gather(1, (scs + w_ * lg).argmax(1, keepdim=True))[:, 0] if on else tp[:, 0]
            wrong = int((g_ != truth).sum())
            k = tot.setdefault(name, {}).setdefault(seed, [0, 0, {}])
            k[0] += wrong; k[1] += wrong == 0; k[2][kind] = k[2].get(kind, 0) + wrong
for name, d in tot.items():
    print(name, " ".join(f"seed {s}: wrong {v[0]} one-pass {v[1]}/40 {v[2]}" for s, v in d.items()))
