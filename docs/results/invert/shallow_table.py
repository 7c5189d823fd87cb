"""Fast mode without a table fits h_t ≈ A e_v + B ĥ_{t−1} + c. Would a cheap nonlinear token feature, the position-0
table of a SHALLOW layer ℓ' (V tokens through ℓ' blocks instead of ℓ), recover the full table's ranking power?
Fits the forward model of layer ℓ with token features [e_v], [e_v, table_ℓ'_v] for each ℓ' and [e_v, table_ℓ_v]
(full), on the same calibration rows (the fast sizes raised for the extra features, as LearnedConfig.sizes does),
gain chosen on fresh validation rows as the fit does; then counts top-1 and ranks of the true token at positions
1.. of held-out bench prompts (plain linear scores: no prior, no lens, no screen).
    python shallow_table.py MODEL LAYER SHALLOW_LAYERS SEED [full]    e.g. smollm2 30 1,2,4 907 full"""
import sys, time, torch
from common import bench_prompts
from sipit.models import LayerTap, load_model
from sipit.models.tap import position0_tables
from sipit.invert.learned.config import LearnedConfig
from sipit.invert.learned.data import calibration_ids
from sipit.invert.learned.fit import _forward_models, _best_gain
from sipit.invert.learned.cache import predictions
torch.set_num_threads(2)
name, layer, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[4])
shallow = [int(x) for x in sys.argv[3].split(",")]
full = len(sys.argv) > 5 and sys.argv[5] == "full"
lm = load_model(name)
E = lm.embedding_rows().float()
cfg = LearnedConfig.fast()
d, V = lm.d_model, lm.vocab_size
n_tokens = LearnedConfig(calibration_tokens=cfg.calibration_tokens).sizes(d, V)[0]  # 3d features' floor
ids = calibration_ids(lm, n_tokens, cfg.seq_len, cfg.random_fraction)
print(name, "layer", layer, "calibration tokens", ids.numel(), flush=True)
t0 = time.perf_counter()
tables = {}
for s in shallow + ([layer] if full else []):
    t = time.perf_counter()
    tables[s] = position0_tables(lambda x: [LayerTap(lm, s).states(x)], V, lm.device)[0]
    print(f"table at layer {s}: {time.perf_counter() - t:.1f} s", flush=True)
variants = [("none", None)] + [(f"table{s}", tables[s]) for s in tables]
tap = LayerTap(lm, layer)
observe = lambda x: [tap.states(x).float()] * len(variants)
t = time.perf_counter()
models = _forward_models(observe, E, [tb for _, tb in variants], ids, cfg.ridge)
print(f"forward models: {time.perf_counter() - t:.1f} s", flush=True)
val = calibration_ids(lm, cfg.validation_rows * cfg.seq_len, cfg.seq_len, cfg.random_fraction, seed=1)[:, :20]
H_val = tap.states(val).float()
data, pids, states = bench_prompts(lm, tap, seed)
H = torch.stack(states)
kinds = [k for k, _ in data]
for (vname, tb), m in zip(variants, models):
    P, P_sq = predictions(E, m["mx"], m["A"], tb)
    def resid(Hx):
        return (Hx[:, 1:] @ m["white"] - Hx[:, :-1] @ m["Bw"] - m["cw"]).reshape(-1, P.shape[1])
    S = 2 * resid(H_val) @ P.T
    g = _best_gain(S, P_sq, val[:, 1:].reshape(-1), cfg.gains)[0]
    S = 2 * resid(H) @ P.T - g * P_sq
    truth = pids[:, 1:].reshape(-1)
    rank = (S > S.gather(1, truth[:, None])).sum(1)
    by = {}
    for k in ["prose", "code", "random", "chat"]:
        sel = torch.tensor([kk == k for kk in kinds]).repeat_interleave(19)
        r = rank[sel]
        by[k] = f"{int((r == 0).sum())}/{len(r)} top1, top16 {int((r < 16).sum())}, mean rank {float(r.float().mean()):.1f}"
    print(f"{vname:8s} gain {g}: wrong first {int((rank > 0).sum())}/{len(rank)}, past 16 {int((rank >= 16).sum())}, "
          f"mean rank {float(rank.float().mean()):.1f} | " + " | ".join(f"{k}: {v}" for k, v in by.items()), flush=True)
