"""What the sampled and exhaustive collision tests share: layer specs, run directories that resume,
state chunks, and the per-layer analysis that separates structural from numerical collisions.

Structural collisions. Two inputs whose embedding rows are identical at every position the state
depends on produce the same state by construction (SmolLM2's dequantized embeddings have such
duplicate rows). The state at layer 0 depends on the last token only; at layer ℓ ≥ 1 on the whole
sequence. Inputs with the same such key form a class: pairs inside a class are *structural*
collisions (listed, counted, their observed distance checked), and the pairwise search runs on one
representative per class, which covers every other pair.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as st_save
from tqdm import tqdm

from ..io import SipitError, atomic_write, read_json, write_json
from .pairwise import min_pairwise


def parse_layers(spec, lm) -> list[int]:
    """'all' (or None) | '1,15,-1' | [1, 15, -1] -> sorted distinct layers of lm, each normalised by
    LM.layer_index (the one place that knows a model's layers: 0..L, negative from the end)."""
    if spec is None or spec == "all":
        return list(range(lm.n_layers + 1))
    out = set()
    for item in spec.split(",") if isinstance(spec, str) else spec:
        try:
            layer = int(item)
        except ValueError:
            raise SipitError(f"bad layer {item!r} in --layers: use 'all' or integers like 1,15,-1") from None
        out.add(lm.layer_index(layer))
    if not out:
        raise SipitError("no layer given in --layers")
    return sorted(out)


def layer_key(layer: int) -> str:
    return f"L{layer:03d}"


# ---------------------------------------------------------------- run directories


def open_run_dir(out_dir: Path, kind: str, config: dict, info: dict) -> None:
    """Create `out_dir` with config.json, or check that the run there has the same config.

    A run directory holds one job: rerunning the same config resumes it, a different one is refused.
    """
    path = Path(out_dir) / "config.json"
    if path.exists():
        old = read_json(path)
        if old.get("kind") != kind:
            raise SipitError(f"{out_dir} holds a {old.get('kind')!r} run, not {kind!r}: choose another output dir")
        diff = {k: (old["config"].get(k), v) for k, v in config.items() if old["config"].get(k) != v}
        diff.update({k: (v, None) for k, v in old["config"].items() if k not in config})
        if diff:
            what = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in sorted(diff.items()))
            raise SipitError(f"{out_dir} holds a run with a different config ({what}): "
                             "rerun with the same options to resume, or choose another output dir")
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_json(path, {"kind": kind, "config": config, **info})


def capture_states(job: dict, ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], float]:
    """An engine task: the states of one batch of prompts at job's layers, on the CPU.

    job: model (engines.ModelRef), layers, final_norm, and `prefix` (ids) for the append-every-token
    test, whose batch holds candidate tokens appended to that prefix. ids: prompts [B, T], or
    candidate tokens [B] with a prefix. Returns ({layer key: [B, d]} last-token states, seconds)."""
    from ..engines import worker_model
    from ..models import LayerTap, run_layers

    t = time.perf_counter()
    lm, layers = worker_model(job["model"]), job["layers"]
    ids = ids.to(lm.device)
    with torch.no_grad():
        if job.get("prefix") is None:
            states = [h[:, -1] for h in run_layers(lm, layers, ids=ids, final_norm=job["final_norm"])]
        else:
            tap = LayerTap(lm, max(layers), final_norm=job["final_norm"])
            prefix = tap.prefill(torch.tensor(job["prefix"], device=lm.device))
            states = tap.extend_layers(prefix, ids, layers)
    return {layer_key(l): h.cpu() for l, h in zip(layers, states)}, time.perf_counter() - t


def run_batches(engine, job: dict, batches: list[torch.Tensor], chunks: list[Path],
                progress: bool, desc: str) -> None:
    """Capture the states of every batch whose chunk file is missing (the resume unit), on engine;
    each chunk is written once, atomically, by this process as its task finishes."""
    from ..engines import LocalEngine

    todo = [(b, c) for b, c in zip(batches, chunks) if not c.exists()]
    bar = tqdm(total=len(todo), disable=not progress, desc=desc, unit="batch")
    gpu = job["model"].device.startswith("cuda")
    for k, (states, seconds) in (engine or LocalEngine()).map(capture_states, [b for b, _ in todo], job, gpu=gpu):
        save_chunk(todo[k][1], states, seconds)
        bar.update()
    bar.close()


def save_chunk(path: Path, states: dict[str, torch.Tensor], seconds: float) -> None:
    """One batch of states {layer key: [B, d]} as safetensors, written atomically."""
    data = {k: v.contiguous() for k, v in states.items()}
    atomic_write(path, st_save(data, metadata={"seconds": repr(seconds)}))


def chunk_seconds(path: Path) -> float:
    with safe_open(path, "pt") as f:
        return float(f.metadata()["seconds"])


def load_layer(paths: list[Path], layer: int) -> torch.Tensor:
    """Concatenate one layer's states from the chunk files, in order. -> [N, d]"""
    parts = []
    for p in paths:
        with safe_open(p, "pt") as f:
            parts.append(f.get_tensor(layer_key(layer)))
    return torch.cat(parts)


def cached_json(path: Path, compute):
    """read_json(path) if it exists, else compute() written there atomically (the resume unit)."""
    if path.exists():
        return read_json(path)
    out = compute()
    write_json(path, out)
    return out


# ---------------------------------------------------------------- structural classes


def embedding_classes(lm) -> torch.Tensor:
    """For every token id, the smallest id with an identical embedding row. -> [V] long"""
    from ..invert.verify import duplicate_classes  # the one definition of duplicate tokens

    return duplicate_classes(lm).rep.clone()


def group_ids(keys: list) -> torch.Tensor:
    """keys[i] (hashable) -> [N] long: index of the first row with the same key."""
    first: dict = {}
    return torch.tensor([first.setdefault(k, i) for i, k in enumerate(keys)], dtype=torch.long)


QUANTILES = [0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0]
REL_EDGES = [10.0 ** (e / 20) for e in range(-80, 21)]  # relative distance 1e-4 .. 10, 20 bins per decade


def distribution(x: torch.Tensor, scale: float, rows: int = 1024, seed: int = 0) -> dict:
    """Distances / scale over all pairs among `rows` rows of x [N, d] drawn with `seed`: quantiles
    and a histogram on REL_EDGES (counts[0] below the first edge, counts[-1] above the last).
    For plots only: the exact minimum comes from the pairwise search."""
    idx = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[: min(rows, len(x))].sort().values
    sub = x[idx].double()
    sub = sub - sub.mean(0)
    i, j = torch.triu_indices(len(sub), len(sub), 1)
    rel = torch.cdist(sub, sub)[i, j] / (scale if scale > 0 else 1.0)
    counts = torch.bucketize(rel, torch.tensor(REL_EDGES, dtype=rel.dtype), right=True).bincount(minlength=len(REL_EDGES) + 1)
    q = torch.quantile(rel, torch.tensor(QUANTILES, dtype=rel.dtype)) if len(rel) <= 2**24 else None
    return dict(rows=len(idx), pairs=len(rel), seed=seed, quantiles=QUANTILES,
                relative_quantiles=q.tolist() if q is not None else None, edges=REL_EDGES, counts=counts.tolist())


def analyse_layer(x: torch.Tensor, groups: torch.Tensor, *, layer: int, threshold: float, keep: int,
                  progress: bool = False, max_classes: int = 50, engine=None, device=None) -> dict:
    """Minimum pairwise distance of the rows of x [N, d] whose structural classes are `groups` [N]
    (groups[i] = representative row of row i, see group_ids). Row indices in the output refer to x.

    engine (sipit.engines): where the pairwise search's panels run (default: this process);
    device: the pairwise search's device (default x's: the model's device, e.g. cuda, is faster).
    Returns a JSON-able dict: the minimum over non-structural pairs (exact, float64) and relative to
    the median row norm, the `keep` closest pairs, the pairs at distance <= threshold, the
    distribution of distances on a row subsample, and the structural classes with the largest
    distance observed inside one (0 up to rounding).
    """
    t0 = time.perf_counter()
    n = len(x)
    reps = torch.unique(groups)  # sorted: representatives are the first row of their class
    median_norm = float(x.double().norm(dim=1).median())
    size = torch.bincount(groups, minlength=n)  # class size, indexed by representative
    classes = [(groups == r).nonzero()[:, 0] for r in (size > 1).nonzero()[:, 0]]
    structural_pairs = int(sum(len(m) * (len(m) - 1) // 2 for m in classes))
    worst = max((float((x[m].double() - x[m[0]].double()).norm(dim=1).max()) for m in classes), default=0.0)

    out = dict(layer=layer, n=n, n_pairs=n * (n - 1) // 2, median_norm=median_norm, threshold=threshold,
               distribution=distribution(x[reps], median_norm) if len(reps) >= 2 else None,
               structural=dict(pairs=structural_pairs, classes=len(classes), max_distance=worst,
                               members=[m.tolist() for m in classes[:max_classes]]))
    if len(reps) < 2:  # everything is one class: no non-structural pair exists
        out.update(min_distance=None, min_relative=None, min_pair=None, closest=[], below_threshold=0,
                   below_pairs=[], searched_pairs=0, screen_candidates=0, seconds=time.perf_counter() - t0)
        return out
    # the engine's absolute-distance histogram is not reported here (hist_rows small):
    # `distribution` gives the relative distances and quantiles the plots need
    res = min_pairwise(x[reps].to(device or x.device), threshold=threshold, keep=keep, progress=progress,
                       hist_rows=64, engine=engine)
    rel = (lambda d: d / median_norm) if median_norm > 0 else (lambda d: 0.0)
    pair = lambda i, j, d: dict(i=int(reps[i]), j=int(reps[j]), distance=d, relative=rel(d))  # noqa: E731
    below = [pair(*p) for p in res.below_pairs]
    out.update(
        min_distance=res.min_distance, min_relative=rel(res.min_distance),
        min_pair=[int(reps[res.min_pair[0]]), int(reps[res.min_pair[1]])],
        closest=[pair(*p) for p in res.closest],
        # each representative pair stands for size_i * size_j pairs of rows
        below_threshold=int(sum(int(size[p["i"]]) * int(size[p["j"]]) for p in below))
        if len(below) == res.below_threshold else res.below_threshold,
        below_pairs=below, searched_pairs=res.n_pairs, screen_candidates=res.candidates,
        seconds=time.perf_counter() - t0,
    )
    return out
