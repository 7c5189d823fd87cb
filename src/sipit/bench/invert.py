"""Benchmark: SipIt inversion speed and exactness per policy, against one forward pass.

For each layer: prompts of `--length` tokens from three kinds of text (prose from the `prose`
corpus, Python code from the half of the standard library the learned policy never calibrates on,
uniform random ids), states captured by one full forward pass of each whole prompt, then every
policy inverts them. Each prompt's forward pass up to the layer is timed right before its
inversion (median of 3), so the ratio compares like with like under the same load. Slow policies
(exhaustive, random, gradient: minutes per prompt on SmolLM2) invert only the first
`--slow-positions` positions of `--slow-prompts` prompts; their ratio is per position × length.
Prints JSON. One-time calibration is reported separately and is not in the inversion times.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from ..invert import InvertConfig, SipIt
from ..invert.learned.data import calibration_ids, stdlib_files
from ..models import LayerTap, load_model

FAST = ("learned",)


def code_prompts(lm, n: int, length: int, seed: int) -> list[list[int]]:
    """Spans of stdlib source from files the learned policy does not calibrate on."""
    rng = random.Random(f"{seed}:code")
    files = stdlib_files(calibration_half=False)
    rng.shuffle(files)
    out = []
    for f in files:
        ids = lm.encode(f.read_text(encoding="utf-8", errors="replace"))
        if len(ids) >= length + 1:
            s = rng.randrange(0, len(ids) - length)
            out.append(ids[s:s + length])
        if len(out) == n:
            break
    return out


def prompts(lm, kinds: list[str], n: int, length: int, seed: int) -> list[tuple[str, list[int]]]:
    from ..corpora import sample

    out = []
    for kind in kinds:
        if kind == "code":
            out += [("code", p) for p in code_prompts(lm, n, length, seed)]
        else:
            out += [(kind, p.ids) for p in sample(f"{kind}:{n}", lm.tokenizer, length, seed=seed)]
    return out


def leaked(prompt_ids: list[list[int]], calib: torch.Tensor) -> int:
    """How many prompts occur verbatim inside the calibration rows (must be 0)."""
    rows = calib.tolist()
    found = 0
    for p in prompt_ids:
        k = len(p)
        found += any(r[i:i + k] == p for r in rows for i in range(len(r) - k + 1) if r[i] == p[0])
    return found


def _forward_seconds(tap, ids, repeats=3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        tap.states(ids[None])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(model="smollm2", layers=None, policies=("learned", "gradient", "random", "exhaustive"),
        kinds=("prose", "code", "random"), n=10, length=20, threads=2, seed=1, slow_prompts=1, slow_positions=2,
        final_norm=False, progress=False) -> dict:
    torch.set_num_threads(threads)
    lm = load_model(model)
    layers = layers or [1, lm.n_layers // 2, lm.n_layers]
    data = prompts(lm, list(kinds), n, length, seed)
    cfg0 = InvertConfig()
    out = dict(bench="invert", model=model, threads=threads, length=length, kinds=list(kinds), prompts_per_kind=n,
               final_norm=final_norm, calibration_leaks=leaked([p for _, p in data],
                                                               calibration_ids(lm, cfg0.calibration_tokens)),
               layers={})
    for layer in layers:
        layer = lm.layer_index(layer)
        tap = LayerTap(lm, layer, final_norm=final_norm)
        ids = torch.tensor([p for _, p in data])
        states = torch.cat([tap.states(ids[i:i + 16]) for i in range(0, len(ids), 16)])  # full forward passes
        entry = out["layers"][str(layer)] = dict(policies={})
        for name in policies:
            slow = name not in FAST
            sel = list(range(len(data)))[:slow_prompts] if slow else list(range(len(data)))
            T = slow_positions if slow else length
            engine = SipIt(lm, layer, InvertConfig(policy=name), final_norm=final_norm)
            fwd, inv, res = [], [], []
            for i in sel:
                fwd.append(_forward_seconds(tap, ids[i]))
                r = engine.invert_prompt(states[i, :T], ids[i, :T].tolist())
                inv.append(r.seconds)
                res.append(r)
                if progress:
                    print(f"L{layer} {name} {data[i][0]} {r.status} exact={r.exact} {r.seconds:.2f}s "
                          f"fwd={fwd[-1]:.3f}s tried={sum(q.tried for q in r.positions)}", flush=True)
            per_prompt = [s * length / T for s in inv]  # slow policies: extrapolated to the full length
            positions = [q for r in res for q in r.positions]
            tried = [q.tried for q in positions]
            kinds_ok = {}
            for i, r in zip(sel, res):
                k = kinds_ok.setdefault(data[i][0], [0, 0])
                k[0] += bool(r.exact)
                k[1] += 1
            entry["policies"][name] = dict(
                prompts=len(res), positions_per_prompt=T, extrapolated=slow,
                exact=sum(bool(r.exact) for r in res), exact_by_kind={k: f"{a}/{b}" for k, (a, b) in kinds_ok.items()},
                failed=sum(r.status == "failed" for r in res),
                seconds_per_prompt_median=round(statistics.median(per_prompt), 4),
                forward_seconds_median=round(statistics.median(fwd), 4),
                ratio_to_forward=round(statistics.median(per_prompt) / statistics.median(fwd), 3),
                candidates_per_position=round(sum(tried) / len(tried), 3),
                vocab_explored_pct=round(100 * sum(tried) / len(tried) / lm.vocab_size, 5),
                forward_equivalents_per_prompt=round(
                    statistics.mean(r.forward_equivalents * length / T for r in res), 3),
                tap_calls_per_prompt=round(statistics.mean(r.tap_calls for r in res), 3),
                speculated_pct=round(100 * sum(q.via != "search" for q in positions) / len(positions), 2),
                calibration_seconds=round(engine.calibration_seconds, 1),
                min_margin=min((q.margin for q in positions if q.margin is not None), default=None),
                max_distance=max((q.distance for q in positions if q.token is not None), default=None),
            )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="sipit bench invert", description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--layers", default=None, help="comma-separated (default 1, L/2, L)")
    p.add_argument("--policies", default="learned,gradient,random,exhaustive")
    p.add_argument("--kinds", default="prose,code,random")
    p.add_argument("--prompts", type=int, default=10, help="prompts per kind (fast policies)")
    p.add_argument("--length", type=int, default=20)
    p.add_argument("--slow-prompts", type=int, default=1)
    p.add_argument("--slow-positions", type=int, default=2)
    p.add_argument("--final-norm", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--progress", action="store_true", help="a line per prompt on stdout before the JSON")
    a = p.parse_args(argv)
    layers = [int(x) for x in a.layers.split(",")] if a.layers else None
    print(json.dumps(run(a.model, layers, a.policies.split(","), a.kinds.split(","), a.prompts, a.length, a.threads,
                         a.seed, a.slow_prompts, a.slow_positions, a.final_norm, a.progress), indent=2))


if __name__ == "__main__":
    main()
