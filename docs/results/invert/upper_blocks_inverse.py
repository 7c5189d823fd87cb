"""Can a deep layer's state be carried back to a lower layer at one position, so that the lower layer's (much
better) ranker could order a deep search? With the prefix known, the blocks LOW..TOP-1 at position t are a fixed map
F from the layer-LOW state z to the layer-TOP state y; the truth's z* solves F(z) = y. Two solvers, from the
layer-LOW state of another token (the true id + 1) on the same prefix, each step reported as (‖F(z) − y‖ / ‖y‖,
‖z − z*‖ / ‖z*‖):
- fixed point z <- z − (F(z) − y) (F = identity + the blocks' residuals), 10 steps;
- Levenberg-Marquardt: the Jacobian by batched finite differences (d + 1 one-token rows), the step shrunk until the
  residual falls, 10 steps.
The bench prompts of a seed, one of each source, positions 3, 10 and 17; layer TOP must be below the last (the last
hidden state of transformers' output is normed).

    python upper_blocks_inverse.py TOP LOW SEED        e.g. 29 15 1303"""
import sys
import time

import torch
from transformers import DynamicCache

import common

top, low, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
lm = common.smollm2()
base = lm.base


def upper(z, cache, t):
    """z [n, d]: layer-`low` states at position t -> their layer-`top` states [n, d], each row on the prefix cache."""
    n = len(z)
    rows = DynamicCache(config=lm.model.config)
    for i in range(low, top):
        rows.update(cache.layers[i].keys.expand(n, -1, -1, -1), cache.layers[i].values.expand(n, -1, -1, -1), i)
    pos = torch.full((n, 1), t)
    h = z[:, None]
    pe = base.rotary_emb(h, pos)
    for i in range(low, top):
        h = lm.blocks[i](h, attention_mask=None, position_ids=pos, cache=rows, use_cache=True, position_embeddings=pe)
        h = h[0] if isinstance(h, tuple) else h
    return h[:, 0]


def fixed_point(z, y, cache, t, zs):
    log = []
    for _ in range(10):
        r = upper(z[None], cache, t)[0] - y
        log.append((float(r.norm() / y.norm()), float((z - zs).norm() / zs.norm())))
        z = z - r
    return log


def marquardt(z, y, cache, t, zs):
    fz = upper(z[None], cache, t)[0]
    r, lam, log = fz - y, 1e-2, []
    eye = torch.eye(len(z))
    for _ in range(10):
        log.append((float(r.norm() / y.norm()), float((z - zs).norm() / zs.norm())))
        step = 1e-3 * float(z.norm()) / len(z) ** 0.5
        J = ((upper(z[None] + step * eye, cache, t) - fz) / step).T.double()  # [d_out, d_in]
        JtJ, Jtr = J.T @ J, J.T @ r.double()
        scale = float(JtJ.diagonal().mean())
        for _ in range(6):
            dz = torch.linalg.solve(JtJ + lam * scale * eye.double(), Jtr).float()
            f2 = upper((z - dz)[None], cache, t)[0]
            if (f2 - y).norm() < r.norm():
                z, fz, r, lam = z - dz, f2, f2 - y, lam / 3
                break
            lam *= 10
    log.append((float(r.norm() / y.norm()), float((z - zs).norm() / zs.norm())))
    return log


with torch.no_grad():
    for src, ids in common.prompts(lm, common.SOURCES, 1, 20, seed):
        ids = torch.tensor(ids)
        H = base(input_ids=ids[None], output_hidden_states=True).hidden_states
        for t in (3, 10, 17):
            cache = DynamicCache(config=lm.model.config)
            base(input_ids=ids[None, :t], cache=cache, use_cache=True)
            y, zs = H[top][0, t], H[low][0, t]
            check = float((upper(zs[None], cache, t)[0] - y).norm() / y.norm())
            other = ids.clone()
            other[t] = (int(ids[t]) + 1) % lm.vocab_size
            z0 = base(input_ids=other[None, :t + 1], output_hidden_states=True).hidden_states[low][0, t]
            for name, solve in (("fixed point", fixed_point), ("marquardt", marquardt)):
                t0 = time.perf_counter()
                log = solve(z0, y, cache, t, zs)
                print(f"{src:6s} t={t:2d} F(z*) vs y {check:.0e} {name:11s} {time.perf_counter() - t0:4.1f} s: "
                      + " ".join(f"{a:.2g}/{b:.2g}" for a, b in log), flush=True)
