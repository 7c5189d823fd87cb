"""Smallest projection size k that still pins every token down (exact, unambiguous recovery).

For each prompt position t, every vocabulary token v is appended to the *true* prefix once and its
state h_t(π ⊕ v) at the layer is computed (one pass of V candidates). For a projection P (nested:
P_k = the first k rows of one d-row matrix, so all k are read off the same states), position t is
*pinned* at k when the true token passes (its recomputation noise, relative to ‖P_k ĥ_t‖, stays
within ε) and it is the only one within ε of the leaked observation P_k ĥ_t, up to its duplicate class. SipIt with any policy recovers a prompt exactly and unambiguously
iff every position is pinned (it verifies on the true prefix, position by position). Reported: the
smallest k with every position of every prompt pinned, per model / layer / projection kind.

    PYTHONPATH=src python docs/results/surfaces/projection_k.py --model tiny-llama --prompts 8 --length 12
    PYTHONPATH=src python docs/results/surfaces/projection_k.py --model smollm2 --layers 1 --prompts 2 --length 4
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from sipit.models import load_model
from sipit.models import LayerTap
from sipit.models.surfaces import random_projection

EPS = 1e-4  # the relative acceptance radius this measurement fixes (SipIt's measured ε is smaller on
#            these models: eps.py), so k is the smallest projection that pins tokens at 1e-4


@torch.no_grad()
def candidate_states(tap, ids: list[int], t: int, batch: int) -> torch.Tensor:
    """States at position t of every token appended to ids[:t]. -> [V, d]"""
    prefix = tap.prefill(torch.tensor(ids[:t]))
    V = tap.lm.vocab_size
    return torch.cat([tap.extend(prefix, torch.arange(s, min(s + batch, V))) for s in range(0, V, batch)])


def smallest_k(H: torch.Tensor, target: torch.Tensor, same: torch.Tensor, P: torch.Tensor) -> int:
    """Smallest k such that for every k' ≥ k the true token (recomputed on the prefix, so with its
    recomputation noise) is within ε of P_k' target and no token outside `same` is. H [V, d]."""
    diff = ((H - target) @ P.T).double()  # [V, d_proj], column j = coordinate j
    ref = (P @ target).double()
    num = diff.square().cumsum(1).sqrt()  # [V, k]: ‖P_k (h_v − ĥ)‖ for every k
    den = ref.square().cumsum(0).sqrt().clamp_min(1e-30)
    within = (num / den) <= EPS  # [V, k]
    bad = (within[~same].any(0) | ~within[same].any(0)).nonzero().flatten()  # an impostor passes, or the truth fails
    if len(bad) and int(bad.max()) == P.shape[0] - 1:
        return None  # not pinned even with every row of P
    return int(bad.max()) + 2 if len(bad) else 1


def _pca(states: torch.Tensor) -> torch.Tensor:
    """All principal directions the states give (at most min(N, d)), as rows."""
    return random_projection(states.shape[1], min(states.shape), "pca", states=states)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--layers", default=None, help="comma list (default 1, L/2, L)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--length", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--pca-prompts", type=int, default=64, help="other random prompts whose states fit the PCA")
    ap.add_argument("--out", default=str(Path(__file__).parent / "projection_k.jsonl"))
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    lm = load_model(args.model)
    L, d = lm.n_layers, lm.d_model
    layers = [int(x) for x in args.layers.split(",")] if args.layers else [1, L // 2, L]
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, lm.vocab_size, (args.prompts, args.length), generator=gen).tolist()
    fit_ids = torch.randint(0, lm.vocab_size, (args.pca_prompts, args.length), generator=gen)
    E = lm.embedding_rows()
    for layer in layers:
        t0 = time.perf_counter()
        tap = LayerTap(lm, layer)
        full = tap.states(torch.tensor(prompts))  # [N, T, d] leaked states
        projections = {"gaussian": random_projection(d, d, "gaussian", seed=1),
                       "coords": random_projection(d, d, "coords", seed=1),
                       "pca": _pca(tap.states(fit_ids).reshape(-1, d))}
        worst = {name: 1 for name in projections}
        for i, ids in enumerate(prompts):
            for t in range(len(ids)):
                H = candidate_states(tap, ids, t, args.batch)
                same = (E == E[ids[t]]).all(1)
                for name, P in projections.items():
                    k = smallest_k(H, full[i, t], same, P)
                    worst[name] = None if k is None or worst[name] is None else max(worst[name], k)
        row = dict(model=args.model, d=d, V=lm.vocab_size, layer=layer, prompts=args.prompts, length=args.length,
                   random_ids=True, eps=EPS, smallest_k=worst, pca_rows=projections["pca"].shape[0], seconds=round(time.perf_counter() - t0, 1),
                   load=os.getloadavg()[0])
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
