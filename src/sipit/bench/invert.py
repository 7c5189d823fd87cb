"""Benchmark: SipIt inversion speed, exactness and certificates per policy, against one forward pass.

For each layer: prompts of `--length` tokens from three kinds of text (prose from the `prose`
corpus, Python code from the half of the standard library the learned policy never calibrates on,
uniform random ids), states captured by one full forward pass of each whole prompt, then every
policy inverts the same prompts in this one run. Each prompt's forward pass up to the layer is
timed right before its inversion (median of 3), so the ratio compares like with like under the
same load. Slow policies (exhaustive, random, gradient: minutes per prompt on SmolLM2) are capped:
they invert only the first `slow_prompts` prompts of each kind (the same prompts the learned policy
inverts first) and only the first `slow_positions` positions of each (`capped_positions` in the
output; their ratio is per position × length, marked `extrapolated`), each within
`slow_max_seconds` (a prompt that hits it counts as failed, `time_capped`). The learned policy's entry
also gives its numbers on that same subset (`on_slow_subset`), for a like-for-like comparison.

Reported per policy: the ratio to the forward pass overall (median seconds ÷ median forward) and
per text source (median and max of each prompt's seconds ÷ its own forward), and as a file of these prompts
one at a time (`ratio_of_totals`, per source `of_totals`: Σ seconds ÷ Σ forwards, where the heavy tail of deep
searches counts), candidates *verified* by a forward pass (the paper's metric) and candidates *scored* (the
learned policy scores the whole vocabulary at every position; the gradient policy ranks the whole vocabulary at
every snap), one-time calibration seconds and the amortised cost per
prompt (calibration ÷ N + inversion, N = 1, 100, 10,000; what the engine sets up at its first prompt is timed apart
by one untimed inversion first: `warmup_seconds`), the share of certified positions, ε and
its headroom, and the cost of `certify` modes (extra seconds per prompt). The learned policy also
inverts the prompts B at a time in lock-step (`lock_step`, `--batches`): seconds per batch ÷ one
batched forward pass of the same B prompts (each batch `--batch-repeats` times, the median try), and every
prompt as a file goes (`window`: at most B in flight, the next starting as one finishes) ÷ the batched forwards
of the same prompts B at a time: the throughput a file of many captured prompts gets.
Prints JSON.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace

import torch

from . import print_result, sync
from ..invert import InvertConfig, SipIt
from ..invert.config import batch_size_for
from ..invert.eps import tolerance_for
from ..invert.learned.cli import add_calibration_option
from ..invert.learned.config import calibration_config
from ..invert.learned.data import calibration_ids, random_ids, stdlib_files
from ..models import LayerTap, load_model

TAKES_DEVICE = True  # `sipit bench invert --device cuda` passes the device on

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
        elif kind == "random" and lm.tokenizer is None:  # ids-only models (random:<arch>)
            out += [("random", p) for p in random_ids(lm.vocab_size, n, length, seed).tolist()]
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
    """Median seconds of one forward pass of ids [T] (or a batch [B, T]) up to the tap's layer."""
    times = []
    for _ in range(repeats):
        sync(ids.device)
        t = time.perf_counter()
        tap.states(ids if ids.dim() == 2 else ids[None])
        sync(ids.device)  # CUDA kernels run asynchronously: time until they are done
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@dataclass
class Config:
    model: str = "smollm2"
    layers: list[int] | None = None  # None: 1, L/2, L
    policies: tuple[str, ...] = ("learned", "gradient", "random", "exhaustive")
    kinds: tuple[str, ...] = ("prose", "code", "random")
    prompts: int = 10  # per kind
    length: int = 20
    slow_positions: int = 2  # slow policies invert only this many leading positions of each prompt
    slow_prompts: int | None = None  # ... of only this many prompts per kind (None: all)
    slow_max_seconds: float | None = None  # ... each capped at this many seconds (a capped prompt counts as failed)
    certify: tuple[str, ...] = ("top:256",)  # certify modes timed with the fast policies
    certify_prompts: int | None = None  # ... on this many prompts per kind (None: all)
    certify_full_prompts: int = 0  # also time certify="full" on this many prompts (minutes each on SmolLM2)
    batches: tuple[int, ...] = (1, 8, 32)  # learned policy: prompts inverted in lock-step, B at a time
    batch_repeats: int = 3  # ... each batch this many times, the try of median ratio reported
    threads: int = 2
    device: str = "cpu"
    precision: str = "fp32"
    seed: int = 1
    final_norm: bool = False
    calibration: str = "full"  # the learned policy's: full | fast (learned/config.py)
    progress: bool = False
    batch_size: int | None = None  # candidates per search pass; None: the device's (invert/config.py)


FAST = ("learned",)
AMORTISE_OVER = (1, 100, 10_000)


def _scored(engine) -> int | None:
    """(position, token) scores the engine's ranker has computed so far (learned), else None."""
    ranker = getattr(engine.policy, "ranker", None)
    return ranker.scored if ranker is not None else None


def _scored_per_position(policy: str, V: int, r) -> float:
    """Candidates the policy scored (a distance or a score), per position, where its ranker does not
    count them (_scored)."""
    if policy == "gradient":
        return V * r.backward_tokens / max(len(r.positions), 1)  # every snap ranks the vocabulary
    return sum(q.tried for q in r.positions) / max(len(r.positions), 1)


def first_of_each_kind(data, n: int | None) -> list[int]:
    """Indices of the first n prompts of each kind in `data` [(kind, ids)] (None: all)."""
    seen: dict = {}
    keep = []
    for i, (kind, _) in enumerate(data):
        seen[kind] = seen.get(kind, 0) + 1
        if n is None or seen[kind] <= n:
            keep.append(i)
    return keep


def _invert_all(engine, tap, ids, states, T, cfg, tag):
    fwd, res = [], []
    for i in range(len(ids)):
        fwd.append(_forward_seconds(tap, ids[i]))
        res.append(engine.invert_prompt(states[i, :T], ids[i, :T].tolist()))
        if cfg.progress:
            r = res[-1]
            print(f"{tag} {i} {r.status} exact={r.exact} {r.seconds:.2f}s fwd={fwd[-1]:.3f}s "
                  f"tried={sum(q.tried for q in r.positions)}", flush=True)
    return fwd, res


def interleaved(data) -> list[int]:
    """Indices of `data` [(kind, ids)] taking one prompt of each kind in turn (batches mix the kinds)."""
    rank: dict = {}
    keyed = []
    for i, (kind, _) in enumerate(data):
        rank[kind] = rank.get(kind, 0) + 1
        keyed.append((rank[kind], i))
    return [i for _, i in sorted(keyed)]


def _batch_entry(engine, tap, ids, states, data, B: int, repeats: int = 1) -> dict:
    """Prompts inverted B at a time in lock-step: seconds of each batch ÷ one batched forward pass of
    the same B prompts to the layer (median of 3, timed right before). Prompts interleaved by kind,
    cut into batches of B (a remainder smaller than B is left out); each batch inverted `repeats` times, each try timed
    against its own forward, the try of median ratio reported (`ratio_tries`: all; one try of a 32-prompt batch measured
    3.19 and the next 1.87 on this project's 2-core VM); a prompt counts exact only if every try recovered it. Then all
    of them through a window of B (`window`: _window_entry)."""
    order = interleaved(data)
    batches = [order[i:i + B] for i in range(0, len(order) - B + 1, B)]
    ratios, tries, in_passes, seconds, fwd, res, exact, ok = [], [], [], [], [], [], 0, 0
    for sel in batches:
        runs = []
        for _ in range(repeats):
            f = _forward_seconds(tap, ids[sel])
            sync(ids.device)
            t = time.perf_counter()
            out = engine.invert_prompts([states[i] for i in sel], [ids[i].tolist() for i in sel])
            sync(ids.device)
            runs.append((time.perf_counter() - t, f, out))
        tries.append([round(s / f, 3) for s, f, _ in runs])
        s, f, out = sorted(runs, key=lambda run: run[0] / run[1])[(len(runs) - 1) // 2]
        seconds.append(s)
        fwd.append(f)
        ratios.append(s / f)
        in_passes.append(sum(r.pass_seconds for r in out) / f)
        res += out
        exact += sum(all(run[2][i].exact for run in runs) for i in range(len(sel)))
        ok += sum(all(run[2][i].status == "ok" for run in runs) for i in range(len(sel)))
    return dict(batch=B, batches=len(batches), prompts=len(res), exact=exact, ok=ok, repeats=repeats,
                seconds_per_batch_median=round(statistics.median(seconds), 4),
                forward_seconds_per_batch_median=round(statistics.median(fwd), 4),
                ratio_to_batched_forward_median=round(statistics.median(ratios), 3),
                ratio_to_batched_forward=[round(r, 3) for r in ratios], ratio_tries=tries,
                ratio_in_passes_median=round(statistics.median(in_passes), 3),  # of it, the lock-step passes
                tap_calls_per_prompt=round(statistics.mean(r.tap_calls for r in res), 3),
                window=_window_entry(engine, tap, ids, states, order, B))


def _window_entry(engine, tap, ids, states, order: list[int], B: int) -> dict:
    """Every prompt (in `order`) as the driver inverts a file: at most B in flight, the next starting as one finishes
    (SipIt.invert_prompts(window=B)), seconds ÷ the batched forward passes of the same prompts B at a time."""
    fwd = sum(_forward_seconds(tap, ids[order[i:i + B]]) for i in range(0, len(order), B))
    sync(ids.device)
    t = time.perf_counter()
    res = engine.invert_prompts([states[i] for i in order], [ids[i].tolist() for i in order], window=B)
    sync(ids.device)
    seconds = time.perf_counter() - t
    return dict(prompts=len(res), exact=sum(bool(r.exact) for r in res), ok=sum(r.status == "ok" for r in res),
                seconds=round(seconds, 4), forward_seconds=round(fwd, 4),
                ratio_to_batched_forwards=round(seconds / fwd, 3))


def _policy_entry(name, engine, fwd, res, T, cfg, data, V, scored: int | None = None) -> dict:
    """scored: the ranker's (position, token) scores over these prompts (None: estimated per policy)."""
    per_prompt = [r.seconds * cfg.length / T for r in res]  # capped policies: extrapolated to the length
    positions = [q for r in res for q in r.positions]
    tried = [q.tried for q in positions]
    by_kind: dict = {}
    times: dict = {}  # per text source: (each prompt's seconds, its own forward pass's)
    # prompts whose every guess was right: one pass (each wrong guess costs at least one more, so the share of
    # these places the median ratio: docs/results/invert/README.md, "Where the time goes at the limit")
    one_pass: dict = {}
    for (kind, _), r, f, t in zip(data, res, fwd, per_prompt):
        k = by_kind.setdefault(kind, [0, 0])
        k[0], k[1] = k[0] + bool(r.exact), k[1] + 1
        times.setdefault(kind, []).append((t, f))
        one_pass.setdefault(kind, []).append(all(q.via == "speculation" for q in r.positions))
    median = statistics.median(per_prompt)
    cal = engine.calibration_seconds
    accepted = [q.distance for q in positions if q.token is not None]
    return dict(
        prompts=len(res), positions_per_prompt=T, capped_positions=T < cfg.length, extrapolated=T < cfg.length,
        exact=sum(bool(r.exact) for r in res), exact_by_kind={k: f"{a}/{b}" for k, (a, b) in by_kind.items()},
        ok=sum(r.status == "ok" for r in res), ambiguous=sum(r.status == "ambiguous" for r in res),
        failed=sum(r.status == "failed" for r in res),
        time_capped=sum(r.status == "failed" and "time cap" in r.message for r in res),
        seconds_per_prompt_median=round(median, 4), forward_seconds_median=round(statistics.median(fwd), 4),
        ratio_to_forward=round(median / statistics.median(fwd), 3),
        # what these prompts cost as a file, one at a time: Σ seconds ÷ Σ forward seconds (the heavy tail of deep
        # searches counts here, not in the median)
        seconds_per_prompt_mean=round(statistics.mean(per_prompt), 4),
        ratio_of_totals=round(sum(per_prompt) / sum(fwd), 3),
        ratio_by_kind={k: dict(median=round(statistics.median(t / f for t, f in v), 3),
                               max=round(max(t / f for t, f in v), 3),
                               of_totals=round(sum(t for t, _ in v) / sum(f for _, f in v), 3),
                               one_pass=f"{sum(one_pass[k])}/{len(v)}") for k, v in times.items()},
        one_pass_prompts=f"{sum(sum(v) for v in one_pass.values())}/{len(res)}",
        # where the time goes, each prompt ÷ its forward, medians: the loop's forward passes, and the rest
        # (ranking, certificates, the loop's Python)
        ratio_split=dict(passes=round(statistics.median(r.pass_seconds * cfg.length / T / f for r, f in zip(res, fwd)), 3),
                         rest=round(statistics.median((r.seconds - r.pass_seconds) * cfg.length / T / f
                                                      for r, f in zip(res, fwd)), 3)),
        candidates_verified_per_position=round(sum(tried) / len(tried), 3),
        vocab_verified_pct=round(100 * sum(tried) / len(tried) / V, 5),
        # of them, those only the bfloat16 draft evaluated, far from the observation (sipit.py: _drafted)
        candidates_drafted_per_position=round(sum(q.drafted for q in positions) / len(tried), 3),
        candidates_scored_per_position=round(scored / len(positions), 1) if scored is not None else
        round(statistics.mean(_scored_per_position(name, V, r) for r in res), 1),
        forward_equivalents_per_prompt=round(statistics.mean(r.forward_equivalents * cfg.length / T for r in res), 3),
        tap_calls_per_prompt=round(statistics.mean(r.tap_calls for r in res), 3),
        speculated_pct=round(100 * sum(q.via != "search" for q in positions) / len(positions), 2),
        certified_positions_pct=round(100 * sum(q.certified for q in positions) / len(positions), 2),
        calibration_seconds=round(cal, 1), calibration_cached=cal == 0.0,
        amortised_seconds_per_prompt={str(n): round(cal / n + median, 4) for n in AMORTISE_OVER},
        min_margin=min((q.margin for q in positions if q.margin is not None), default=None),
        max_accepted_distance=max(accepted, default=None),
    )


def run(cfg: Config) -> dict:
    torch.set_num_threads(cfg.threads)
    # the whole model: the learned policy's calibrations below the last layer read it (their lens prior); but a
    # model without a tokenizer (random:<arch>) has no text to fit a lens on: only the blocks needed (an 8B model)
    top = max(cfg.layers) if cfg.model.startswith("random:") and cfg.layers and min(cfg.layers) >= 0 else None
    lm = load_model(cfg.model, precision=cfg.precision, device=cfg.device, max_layer=top)
    V = lm.vocab_size
    layers = cfg.layers or [1, lm.n_layers // 2, lm.n_layers]
    data = prompts(lm, list(cfg.kinds), cfg.prompts, cfg.length, cfg.seed)
    learned = calibration_config(cfg.calibration)
    out = dict(bench="invert", config=asdict(cfg), calibration_leaks=leaked(
        [p for _, p in data], calibration_ids(lm, learned.calibration_tokens, sampled_fraction=learned.sampled_fraction)),
        layers={})
    out["device"] = torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else f"cpu, {cfg.threads} threads"
    ids = torch.tensor([p for _, p in data], device=lm.device)
    for layer in layers:
        layer = lm.layer_index(layer)
        tap = LayerTap(lm, layer, final_norm=cfg.final_norm)
        states = torch.cat([tap.states(ids[i:i + 16]) for i in range(0, len(ids), 16)])  # full forward passes
        t = time.perf_counter()
        tol = tolerance_for(tap, {states.dtype}, batch_size=batch_size_for(cfg, lm.device))
        entry = out["layers"][str(layer)] = dict(eps=tol.eps, noise=tol.noise, eps_seconds=round(time.perf_counter() - t, 2),
                                                 policies={}, certify={})
        worst = 0.0
        slow = first_of_each_kind(data, cfg.slow_prompts)
        for name in cfg.policies:
            fast = name in FAST
            T = cfg.length if fast else min(cfg.slow_positions, cfg.length)
            sel = list(range(len(data))) if fast else slow
            cap = None if fast else cfg.slow_max_seconds
            config = InvertConfig(policy=name, max_seconds=cap, learned=learned, batch_size=cfg.batch_size)
            engine = SipIt(lm, layer, config, final_norm=cfg.final_norm, eps=tol.eps)
            out.setdefault("loop", {k: getattr(engine.config, k)  # the SipIt loop's settings on this device
                                    for k in ("batch_size", "speculate_tokens", "pass_tokens")})
            # one untimed inversion first: what the engine sets up lazily at its first prompt (Gemma-3-270M layer 1,
            # fast calibration, seed 1307: the first prompt 0.42 s, each after it 0.02 s) is a one-time cost like the
            # calibration, reported apart (warmup_seconds), not in the first prompt's ratio
            warmup = engine.invert_prompt(states[sel[0], :T], ids[sel[0], :T].tolist()).seconds if fast else None
            before = _scored(engine)
            fwd, res = _invert_all(engine, tap, ids[sel], states[sel], T, cfg, f"L{layer} {name}")
            scored = _scored(engine) - before if before is not None else None
            e = entry["policies"][name] = _policy_entry(name, engine, fwd, res, T, cfg, [data[i] for i in sel], V, scored)
            e["warmup_seconds"] = round(warmup, 4) if warmup is not None else None
            if fast and len(slow) < len(data):
                e["on_slow_subset"] = {k: v for k, v in _policy_entry(
                    name, engine, [fwd[i] for i in slow], [res[i] for i in slow], T, cfg, [data[i] for i in slow],
                    V).items() if k in ("prompts", "exact", "seconds_per_prompt_median", "ratio_to_forward",
                                        "candidates_verified_per_position", "vocab_verified_pct")}
            if fast and cfg.batches:
                e["lock_step"] = [_batch_entry(engine, tap, ids, states, data, B, cfg.batch_repeats)
                                  for B in cfg.batches if B <= len(data)]
            worst = max(worst, e["max_accepted_distance"] or 0.0)
            for mode in [*cfg.certify, *(["full"] if cfg.certify_full_prompts else [])] if fast else []:
                sub = first_of_each_kind(data, cfg.certify_prompts) if mode != "full" else \
                    list(range(min(cfg.certify_full_prompts, len(data))))
                n = len(sub)
                engine = SipIt(lm, layer, replace(config, certify=mode), final_norm=cfg.final_norm, eps=tol.eps)
                _, cres = _invert_all(engine, tap, ids[sub], states[sub], cfg.length, cfg, f"L{layer} {name} {mode}")
                base = statistics.median(res[i].seconds for i in sub)
                cpos = [q for r in cres for q in r.positions]
                entry["certify"][f"{name} {mode}"] = dict(
                    prompts=n, seconds_per_prompt_median=round(statistics.median(r.seconds for r in cres), 4),
                    extra_seconds_per_prompt=round(statistics.median(r.seconds for r in cres) - base, 4),
                    certified_positions_pct=round(100 * sum(q.certified for q in cpos) / len(cpos), 2),
                    exact=sum(bool(r.exact) for r in cres), ok=sum(r.status == "ok" for r in cres))
        entry["eps_headroom"] = round(tol.eps / worst, 2) if worst else None  # ε ÷ largest accepted distance
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="sipit bench invert", description=__doc__)
    d = Config()
    p.add_argument("--model", default=d.model)
    p.add_argument("--layers", default=None, help="comma-separated (default 1, L/2, L)")
    p.add_argument("--policies", default=",".join(d.policies))
    p.add_argument("--kinds", default=",".join(d.kinds))
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts per kind")
    p.add_argument("--length", type=int, default=d.length)
    p.add_argument("--slow-positions", type=int, default=d.slow_positions,
                   help="slow policies invert only this many leading positions of each prompt")
    p.add_argument("--slow-prompts", type=int, default=d.slow_prompts,
                   help="slow policies invert only this many prompts of each kind (default: all)")
    p.add_argument("--slow-max-seconds", type=float, default=d.slow_max_seconds,
                   help="slow policies: wall-clock cap per prompt (a capped prompt counts as failed, `time_capped`)")
    p.add_argument("--certify", default=",".join(d.certify), help="certify modes timed with the learned policy")
    p.add_argument("--certify-prompts", type=int, default=d.certify_prompts,
                   help="certify modes run on this many prompts of each kind (default: all)")
    p.add_argument("--certify-full-prompts", type=int, default=d.certify_full_prompts)
    p.add_argument("--batches", default=",".join(map(str, d.batches)),
                   help="learned policy: also invert the prompts B at a time in lock-step, for each B (empty: skip)")
    p.add_argument("--batch-repeats", type=int, default=d.batch_repeats,
                   help="each lock-step batch inverted this many times, the try of median ratio reported")
    p.add_argument("--final-norm", action="store_true")
    add_calibration_option(p)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--device", default=d.device)
    p.add_argument("--precision", default=d.precision)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--progress", action="store_true", help="a line per prompt on stdout before the JSON")
    p.add_argument("--batch-size", type=int, default=None,
                   help="candidates per forward pass when searching a position (default 256 on a CPU, 4096 on a GPU)")
    a = p.parse_args(argv)
    if a.batch_repeats < 1:
        p.error(f"--batch-repeats must be at least 1, got {a.batch_repeats}")
    cfg = Config(model=a.model, layers=[int(x) for x in a.layers.split(",")] if a.layers else None,
                 policies=tuple(a.policies.split(",")), kinds=tuple(a.kinds.split(",")), prompts=a.prompts,
                 length=a.length, slow_positions=a.slow_positions, slow_prompts=a.slow_prompts, slow_max_seconds=a.slow_max_seconds,
                 certify=tuple(x for x in a.certify.split(",") if x), certify_prompts=a.certify_prompts,
                 certify_full_prompts=a.certify_full_prompts, batches=tuple(int(x) for x in a.batches.split(",") if x),
                 batch_repeats=a.batch_repeats,
                 threads=a.threads, device=a.device, precision=a.precision, seed=a.seed, final_norm=a.final_norm,
                 calibration=a.calibration, progress=a.progress, batch_size=a.batch_size)
    print_result(lambda: run(cfg), "sipit bench invert", argv, indent=2)


if __name__ == "__main__":
    main()
