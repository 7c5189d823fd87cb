"""Would other features make the ranker's first guesses right more often? Wrong first guesses at layer
LAYER on the bench prompts of each seed, for the forward model h_t ≈ A x_v + B c_t + c fitted as fit.py fits
it (same calibration text, ridge, whitening, gain chosen on the same validation rows), with token features
x_v and context c_t:

    t0       x_v = [e_v, table_v]: position 0's state of v (what the learned policy uses), c_t = ĥ_{t-1}
    t0+mean  the same, c_t = [ĥ_{t-1}, mean of ĥ_1..ĥ_{t-1}]
    t1:ID    x_v = [e_v, v's state at position 1 after the token ID], c_t = ĥ_{t-1}

    python token_features.py LAYER SEEDS CONTEXT_IDS      e.g. 15 5,23,1,7 198 (198: "\\n" in SmolLM2)

Prints per seed and variant the wrong first guesses (of 760 positions) and, per source, (wrong, prompts with
none). A variant counts only if it helps on seeds it was not chosen on."""
import importlib
import sys

import torch

from sipit.bench.invert import prompts
from sipit.models import LayerTap, load_model
from sipit.models.tap import position0_tables

fit = importlib.import_module("sipit.invert.learned.fit")
data = importlib.import_module("sipit.invert.learned.data")
layer, seeds, contexts = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], [int(c) for c in sys.argv[3].split(",")]
torch.set_num_threads(2)
lm = load_model("smollm2")
tap = LayerTap(lm, layer)
E = lm.embedding_rows().float()
V = lm.vocab_size
tables = {"t0": position0_tables(lambda ids: [tap.states(ids)], V, lm.device)[0].float()}
for c in contexts:  # every token after the one context token
    prefix = tap.prefill(torch.tensor([c]))
    tables[f"t1:{c}"] = torch.cat([tap.extend(prefix, v[:, None])[:, 0].float() for v in torch.arange(V).split(1024)])
ids = data.calibration_ids(lm, 49152, 64, 0.2)
H = torch.cat([tap.states(ids[i:i + 16]).float() for i in range(0, len(ids), 16)])  # [N, 64, d]
val = data.calibration_ids(lm, 32 * 64, 64, 0.2, seed=1)[:, :20]
H_val = tap.states(val).float()


def context(Hs: torch.Tensor, with_mean: bool) -> torch.Tensor:
    """Hs [n, S, d] -> context features of positions 1..S-1 [n, S-1, F]."""
    if not with_mean:
        return Hs[:, :-1]
    S = Hs.shape[1]  # the mean of positions 1..t-1 (position 0, an attention sink, left out; zeros at t = 1)
    means = Hs[:, 1:].cumsum(1)[:, :-1] / torch.arange(1, S - 1, dtype=Hs.dtype)[None, :, None]
    return torch.cat([Hs[:, :-1], torch.cat([torch.zeros_like(Hs[:, :1]), means], 1)], 2)


def wrong_guesses(table: torch.Tensor, with_mean: bool, test_ids: torch.Tensor, H_test: torch.Tensor):
    """-> [prompts, T-1] bool: the first guesses (exact scores over the vocabulary) that are wrong."""
    def token(v):
        return torch.cat([E[v], table[v]], 1)
    m = fit.Moments()
    for i in range(0, len(ids), 64):
        Hs, rows = H[i:i + 64], ids[i:i + 64]
        c = context(Hs, with_mean)
        m.add(torch.cat([token(rows[:, 1:].reshape(-1)), c.reshape(-1, c.shape[-1])], 1), Hs[:, 1:].reshape(-1, Hs.shape[-1]))
    Ws, mx, my, resid = m.ridge(1e-3)
    W, Ws, mx, my = fit._whitening(resid).float(), Ws.float(), mx.float(), my.float()
    F = 2 * E.shape[1]
    P = torch.cat([(token(v) - mx[:F]) @ (Ws[:F] @ W) for v in torch.arange(V).split(16384)])  # [V, d]
    P_sq = (P.double() ** 2).sum(1).float()

    def residuals(Hs):
        return ((Hs[:, 1:] - my - (context(Hs, with_mean) - mx[F:]) @ Ws[F:]) @ W).reshape(-1, P.shape[1])
    gain = fit._best_gain(2 * residuals(H_val) @ P.T, P_sq, val[:, 1:].reshape(-1), (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0))[0]
    top = (2 * residuals(H_test) @ P.T - gain * P_sq).argmax(1)
    return (top != test_ids[:, 1:].reshape(-1)).view(len(test_ids), -1)


variants = [("t0", "t0", False), ("t0+mean", "t0", True)] + [(k, k, False) for k in tables if k != "t0"]
for seed in seeds:
    test = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    test_ids = torch.tensor([p for _, p in test])
    H_test = tap.states(test_ids).float()
    for name, table, with_mean in variants:
        wrong = wrong_guesses(tables[table], with_mean, test_ids, H_test)
        per: dict = {}
        for (kind, _), w in zip(test, wrong):
            n = per.setdefault(kind, [0, 0])
            n[0], n[1] = n[0] + int(w.sum()), n[1] + int(w.sum() == 0)
        print(f"layer {layer} seed {seed} {name}: {int(wrong.sum())} wrong; per source (wrong, prompts with none) {per}",
              flush=True)
