"""`sipit reproduce`: the paper's inversion results at our scale, next to the paper's own numbers.

    cfg = ReproduceConfig.quick_preset()              # or ReproduceConfig() for the larger run
    result = run(cfg, out="docs/results/reproduce-quick")
    result.tables                                     # {name: markdown}

Tables (each printed and written as markdown; everything also in results.json):
1. inversion: HardPrompts, BruteForce and SipIt on the same prompts of one model/layer (paper
   Table 2: 100 GPT-2-small prompts of 20 tokens, 90% natural, 10% random). Capped runs are
   reported as such: accuracy over all positions and over the positions the method finished.
2. time by layer (1, L/2, L) and by prompt length (20, 100), natural vs random text (SipIt only).
3. vocabulary explored per position by SipIt, per model (SmolLM2, Gemma-3-270M).
4. layerwise minimum distances (paper Table 1) from a committed `sipit collisions` run (read, not
   recomputed).
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .environment import environment, finished
from .io import SipitError, atomic_write, read_json, write_json

PAPER_TABLE2 = {"hardprompts": (6132.59, 0.00), "bruteforce": (3889.61, 1.00), "sipit": (28.01, 1.00)}
PAPER_SETUP = "GPT-2 small, 100 prompts of 20 tokens (90% natural, 10% random), one GPU"
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
COLLISIONS = tuple(RESULTS / f"collisions-{m}" / "results.json" for m in ("smollm2", "gemma3-270m", "qwen2.5-coder-1.5b"))


@dataclass
class ReproduceConfig:
    model: str = "smollm2"
    layer: int | None = None  # inversion table layer; None: L/2
    length: int = 20  # tokens per prompt (inversion table, vocab table, layer sweep)
    natural: str = "prose:9"  # natural prompts of the inversion table (corpora spec) ...
    random: int = 1  # ... plus this many uniform-random-id prompts (paper: 90% / 10%)
    bruteforce_seconds: float = 600.0  # per prompt wall-clock cap
    hardprompts_seconds: float = 600.0  # per prompt wall-clock cap
    hardprompts_steps: int | None = None  # None: the paper's ¼·T·|V| (the cap binds first)
    policy: str = "learned"  # SipIt's candidate policy
    sweep_prompts: int = 2  # per (kind, cell) of the layer / length sweep
    sweep_lengths: tuple[int, ...] = (20, 100)
    vocab_models: tuple[str, ...] = ("smollm2", "gemma3-270m")
    vocab_prompts: int = 3
    seed: int = 1234  # prompt sampling (not the calibration's seed)
    quick: bool = False

    @classmethod
    def quick_preset(cls) -> "ReproduceConfig":
        """≤ 5 minutes on an idle 2-core machine once the SmolLM2 calibrations (layers 1, L/2, L) are cached;
        other models' uncached calibrations are skipped and said so."""
        return cls(natural="prose:2", random=1, bruteforce_seconds=10.0, hardprompts_seconds=10.0, sweep_prompts=1,
                   vocab_prompts=1, quick=True)


@dataclass
class ReproduceResult:
    config: dict
    environment: dict
    inversion: list[dict] = field(default_factory=list)
    sweep: list[dict] = field(default_factory=list)
    vocab: list[dict] = field(default_factory=list)
    layerwise: list[dict] = field(default_factory=list)
    tables: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


# -- helpers -----------------------------------------------------------------------------------


def _prompts(lm, natural: str, n_random: int, length: int, seed: int) -> list[tuple[str, list[int]]]:
    """-> [(kind, ids)] natural first, then random."""
    from .corpora import sample

    out = []
    for part in filter(None, natural.split(",")):
        out += [(part.split(":")[0], p.ids) for p in sample(part, lm.tokenizer, length, seed=seed,
                                                                  vocab_size=lm.vocab_size)]
    if n_random:
        out += [("random", p.ids) for p in sample(f"random:{n_random}", lm.tokenizer, length, seed=seed,
                                                         vocab_size=lm.vocab_size)]
    return out


def _states(lm, layer: int, ids: list[list[int]]) -> list[torch.Tensor]:
    """One ordinary full forward per prompt (not the inversion's incremental path). -> list of [T, d]."""
    from .models import LayerTap

    tap = LayerTap(lm, layer)
    return [tap.states(torch.tensor(p)) for p in ids]


def _stats(result, capped_at: float | None = None, method: str | None = None) -> dict:
    """Per-method row: seconds mean ± std, accuracy over all / finished positions, exact match."""
    from .invert.result import n_correct

    P = result.prompts
    secs = [p.seconds for p in P]
    correct = sum(n_correct(p) for p in P)
    total = sum(p.length for p in P)
    finished = sum(q.token is not None for p in P for q in p.positions)
    capped = sum("time cap" in p.message for p in P)
    s = result.summary()
    # BruteForce's expected cost: (V + 1) / 2 candidates per position at the measured seconds per pass
    rate = sum(secs) / max(sum(p.tap_calls for p in P), 1)
    return dict(method=method or result.policy, prompts=len(P), positions=total, finished_positions=finished,
                capped_prompts=capped, cap_seconds=capped_at,
                seconds_mean=statistics.mean(secs), seconds_std=statistics.pstdev(secs) if len(secs) > 1 else 0.0,
                token_accuracy=correct / max(total, 1), accuracy_finished=correct / max(finished, 1) if finished else None,
                exact_match=sum(bool(p.exact) for p in P) / max(len(P), 1),
                projected_seconds_per_prompt=rate * (result.vocab_size + 1) / 2 * total / max(len(P), 1),
                vocab_explored_pct=s["vocab_explored_pct"], forward_equivalents_per_prompt=s["forward_equivalents_per_prompt"],
                calibration_seconds=result.calibration_seconds,
                first_loss=[p.loss_curve[0] for p in P if getattr(p, "loss_curve", None)] or None,
                final_loss=[min(p.loss_curve) for p in P if getattr(p, "loss_curve", None)] or None,
                steps=[len(p.loss_curve) for p in P if getattr(p, "loss_curve", None)] or None)


def _mean(xs) -> str:
    return "–" if not xs else f"{statistics.mean(xs):.4g}"


def _fmt(x, nd=2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


# -- the four tables ---------------------------------------------------------------------------


def inversion_table(cfg: ReproduceConfig, lm, layer: int, log) -> tuple[list[dict], str]:
    from .invert import InvertConfig
    from .invert import run as run_method
    from .invert.baselines import HardPromptsConfig

    prompts = _prompts(lm, cfg.natural, cfg.random, cfg.length, cfg.seed)
    ids = [p for _, p in prompts]
    states = _states(lm, layer, ids)
    rows = []
    runs = [("hardprompts", HardPromptsConfig(steps=cfg.hardprompts_steps, max_seconds=cfg.hardprompts_seconds,
                                              log_every=0), cfg.hardprompts_seconds),
            ("bruteforce", None, cfg.bruteforce_seconds),
            ("sipit", InvertConfig(policy=cfg.policy), None)]
    for method, mcfg, cap in runs:
        log(f"  {method} on {len(ids)} prompts (cap {cap}s per prompt)" if cap else f"  {method} on {len(ids)} prompts")
        r = run_method(method, lm, states, layer, max_seconds=cap, config=mcfg, progress=False, true_ids=ids)
        rows.append(dict(**_stats(r, cap, method if method != "sipit" else f"sipit ({r.policy})"), paper_seconds=PAPER_TABLE2[method][0], paper_accuracy=PAPER_TABLE2[method][1],
                         key=method))
    kinds = ", ".join(f"{sum(k == kind for k, _ in prompts)} {kind}" for kind in dict.fromkeys(k for k, _ in prompts))
    md = [f"### Inversion (paper Table 2)\n",
          f"{lm.name}, layer {layer} of {lm.n_layers}, {len(ids)} prompts of {cfg.length} tokens ({kinds}); "
          f"the same prompts and states for every method. Paper: {PAPER_SETUP}.\n",
          "| method | prompts | seconds per prompt (mean ± std) | token accuracy | accuracy over finished positions "
          "| exact match | finished positions | paper: seconds | paper: accuracy |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cap = f" (capped at {r['cap_seconds']:g}s: {r['capped_prompts']}/{r['prompts']} prompts hit the cap)" \
            if r["cap_seconds"] is not None else ""
        md.append(f"| {r['method']}{cap} | {r['prompts']} | {r['seconds_mean']:.2f} ± {r['seconds_std']:.2f} | "
                  f"{r['token_accuracy']:.2f} | {_fmt(r['accuracy_finished'])} | {r['exact_match']:.2f} | "
                  f"{r['finished_positions']}/{r['positions']} | {r['paper_seconds']:.2f} | {r['paper_accuracy']:.2f} |")
    bf = next(r for r in rows if r["key"] == "bruteforce")
    hp = next(r for r in rows if r["key"] == "hardprompts")
    md.append(f"\nToken accuracy counts every position (unfinished = wrong); *accuracy over finished positions* "
              f"counts the positions a method returned a token for (BruteForce only returns verified tokens). "
              f"HardPrompts returns a token at every position: its best projected sequence "
              f"(steps per prompt: {hp['steps']}; its loss, mean over prompts, went from {_mean(hp['first_loss'])} "
              f"at the first step to {_mean(hp['final_loss'])} at the best step). "
              f"Uncapped, BruteForce would need ≈ {bf['projected_seconds_per_prompt']:.0f} s per prompt "
              f"(its measured seconds per forward pass × (|V|+1)/2 expected candidates × {cfg.length} positions). SipIt's one-time calibration: "
              f"{rows[-1]['calibration_seconds']:.1f} s (0 = cached), not included in its seconds.")
    return rows, "\n".join(md) + "\n"


def sweep_table(cfg: ReproduceConfig, lm, mid: int, log) -> tuple[list[dict], str]:
    from .invert import InvertConfig
    from .invert import run as run_method

    L = lm.n_layers
    cells = [(layer, cfg.length) for layer in dict.fromkeys((1, mid, L))]
    cells += [(mid, n) for n in cfg.sweep_lengths if n != cfg.length]
    rows, skipped = [], []
    for layer, length in cells:
        if cfg.quick and cfg.policy == "learned" and not _calibrated(lm, layer):
            skipped.append(f"Layer {layer} ({length} tokens): skipped in --quick because its calibration is not "
                           "cached (one-time, minutes on 2 cores); the full `sipit reproduce` fits and caches it.")
            log(f"  {skipped[-1]}")
            continue
        for kind, spec in (("natural", f"prose:{cfg.sweep_prompts}"), ("random", None)):
            prompts = _prompts(lm, spec or "", 0 if spec else cfg.sweep_prompts, length, cfg.seed + 1)
            ids = [p for _, p in prompts]
            log(f"  sipit layer {layer}, {length} tokens, {kind}: {len(ids)} prompt(s)")
            r = run_method("sipit", lm, _states(lm, layer, ids), layer, config=InvertConfig(policy=cfg.policy),
                           progress=False, true_ids=ids)
            rows.append(dict(layer=layer, length=length, kind=kind, **_stats(r)))
    md = ["### SipIt time by layer and prompt length\n",
          f"{lm.name} (L = {L}), policy {cfg.policy}, {cfg.sweep_prompts} prompt(s) per cell; natural = prose. "
          "Paper: time grows with depth and length, exact recovery throughout (figure, GPT-2 small).\n",
          "| layer | tokens | text | seconds per prompt (mean ± std) | token accuracy | exact match "
          "| vocab explored % | forward passes per prompt | calibration s |",
          "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['layer']} | {r['length']} | {r['kind']} | {r['seconds_mean']:.2f} ± {r['seconds_std']:.2f} | "
                  f"{r['token_accuracy']:.2f} | {r['exact_match']:.2f} | {r['vocab_explored_pct']:.4f} | "
                  f"{r['forward_equivalents_per_prompt']:.1f} | {r['calibration_seconds']:.1f} |")
    md.append("\nCalibration (one-time per model and layer, cached) is not included in seconds per prompt.")
    md += ["", *skipped]
    return rows, "\n".join(md) + "\n"


def vocab_table(cfg: ReproduceConfig, log) -> tuple[list[dict], str]:
    from .invert import InvertConfig
    from .invert import run as run_method
    from .models import load_model

    rows, skipped = [], []
    for name in cfg.vocab_models:
        lm = load_model(name)
        layer = lm.n_layers // 2
        if cfg.quick and cfg.policy == "learned" and not _calibrated(lm, layer):
            skipped.append(f"{name} (V = {lm.vocab_size:,}): skipped in --quick because its layer-{layer} calibration "
                           "is not cached (a one-time fit over every token at position 0 plus 49k tokens: minutes "
                           "on 2 cores); the full `sipit reproduce` fits and caches it.")
            log(f"  {skipped[-1]}")
            continue
        prompts = _prompts(lm, f"prose:{cfg.vocab_prompts}", cfg.random and 1, cfg.length, cfg.seed + 2)
        ids = [p for _, p in prompts]
        log(f"  sipit {name} layer {layer}: {len(ids)} prompt(s)")
        r = run_method("sipit", lm, _states(lm, layer, ids), layer, config=InvertConfig(policy=cfg.policy),
                       progress=False, true_ids=ids)
        rows.append(dict(model=name, vocab_size=lm.vocab_size, layer=layer, n_layers=lm.n_layers, **_stats(r)))
    md = ["### Vocabulary explored per position (SipIt)\n",
          f"Policy {cfg.policy}, {cfg.length}-token prompts (prose + random) at layer L/2. "
          "Paper: SipIt's gradient-guided policy tries a small fraction of the vocabulary before the match; "
          "BruteForce tries half of it on average.\n",
          "| model | vocabulary | layer | prompts | candidates tried per position (% of vocabulary) "
          "| seconds per prompt | exact match | calibration s |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['vocab_size']:,} | {r['layer']}/{r['n_layers']} | {r['prompts']} | "
                  f"{r['vocab_explored_pct']:.4f} | {r['seconds_mean']:.2f} ± {r['seconds_std']:.2f} | "
                  f"{r['exact_match']:.2f} | {r['calibration_seconds']:.1f} |")
    md += ["", *skipped]
    return rows, "\n".join(md) + "\n"


def _calibrated(lm, layer: int) -> bool:
    """Is the learned policy's calibration of (lm, layer) cached?"""
    from .invert import InvertConfig
    from .invert.learned import cache_path, learned_config
    from .models import LayerTap

    return cache_path(LayerTap(lm, layer), learned_config(InvertConfig())).exists()


def layerwise_table(paths=COLLISIONS) -> tuple[list[dict], str]:
    """Table 1 from committed `sipit collisions` runs (one per model): a row per model (layers 1, L/2,
    L and the smallest relative distance over every layer ≥ 1), then each model's layers."""
    rows, summary, detail = [], [], []
    for path in map(Path, paths):
        d = read_json(path)
        series, L = d["series"][0], d["n_layers"]
        layers = [dict(model=d["model"], layer=x["layer"], min_distance=x["min_distance"], min_relative=x["min_relative"],
                       below_threshold=x["below_threshold"], pairs=x["n_pairs"]) for x in series["layers"]]
        rows += layers
        at = {r["layer"]: r for r in layers}
        deep = [r for r in layers if r["layer"] >= 1]
        worst = min(deep, key=lambda r: r["min_relative"])
        cell = lambda r: f"{r['min_distance']:.3g} ({r['min_relative']:.2g})"  # noqa: E731
        summary.append(f"| {d['model']} (`{path.parent.name}`) | {L} | {series['label']} | {series['n_pairs']:,} | "
                       + " | ".join(cell(at[i]) for i in (1, L // 2, L))
                       + f" | {worst['min_relative']:.2g} (layer {worst['layer']}) | {sum(r['below_threshold'] for r in deep)} |")
        detail += [f"\n`{path.parent.name}` ({d['model']}):\n", "| layer | min L2 distance | relative to median norm | pairs ≤ threshold |",
                   "|---:|---:|---:|---:|"]
        detail += [f"| {r['layer']} | {r['min_distance']:.3g} | {r['min_relative']:.3g} | {r['below_threshold']} |"
                   for r in layers if r["layer"] in (1, L // 2, L) or r["layer"] % 5 == 0]
    md = ["### Layerwise minimum distances (paper Table 1)\n",
          "Minimum L2 distance between the last-token states of sampled prompts, per layer (relative = ÷ the median "
          "state norm there), from the committed `sipit collisions` runs; threshold 1e-6. Paper: minimum distances "
          "stay far above the 1e-6 collision threshold at every layer, no collisions among billions of pairs "
          "(GPT-2, Gemma-3, Llama-3, Mistral, Phi).\n",
          "| model (run) | layers | prompts | pairs / layer | layer 1 | layer L/2 | layer L | smallest relative, layers ≥ 1 "
          "| pairs ≤ 1e-6 |", "|---|---:|---|---:|---:|---:|---:|---:|---:|", *summary, *detail,
          "\nLayer 0 (the embeddings) has identical rows for duplicate tokens; they are counted as structural "
          "pairs in the source runs, not as collisions."]
    return rows, "\n".join(md) + "\n"


# -- run ---------------------------------------------------------------------------------------


def run(cfg: ReproduceConfig, out: str | Path, command: str = "", log=print) -> ReproduceResult:
    from .models import load_model

    t0 = time.perf_counter()
    out = Path(out)
    res = ReproduceResult(config=asdict(cfg), environment=environment(command))
    lm = load_model(cfg.model)
    mid = lm.n_layers // 2
    layer = lm.layer_index(cfg.layer) if cfg.layer is not None else mid

    def save():
        res.seconds = time.perf_counter() - t0
        finished(res.environment)
        write_json(out / "results.json", asdict(res))
        e = res.environment
        head = (f"# Reproducing the paper{' (--quick)' if cfg.quick else ''}\n\n"
                f"Command: `{e['command']}` (sipit {e['commit'] or e['version']})  \nDate: {e['date']}; {e['torch_threads']} torch thread(s) on "
                f"{e['cpus']} CPUs ({e['cpu']}); torch {e['torch']}, Python {e['python']}; load average "
                f"{e['load_average_start']} at start, {e['load_average_end']} at end; total {res.seconds:.0f} s.\n")
        atomic_write(out / "tables.md", head + "\n" + "\n".join(res.tables.values()))

    steps = [("layerwise", lambda: layerwise_table()),
             ("inversion", lambda: inversion_table(cfg, lm, layer, log)),
             ("sweep", lambda: sweep_table(cfg, lm, mid, log)),
             ("vocab", lambda: vocab_table(cfg, log))]
    for name, fn in steps:
        log(f"[{name}] ({time.perf_counter() - t0:.0f}s)")
        t = time.perf_counter()
        rows, md = fn()
        setattr(res, name, rows)
        res.tables[name] = md + f"\n({time.perf_counter() - t:.0f} s)\n"
        log(md)
        save()
    log(f"reproduce: {res.seconds:.0f}s -> {out / 'tables.md'}, {out / 'results.json'}")
    return res


def main(args) -> int:
    cfg = ReproduceConfig.quick_preset() if args.quick else ReproduceConfig()
    if args.model:
        cfg.model = args.model
    if args.prompts is not None:
        if args.prompts < 2:
            raise SipitError("--prompts must be at least 2 (natural and random text)")
        cfg.random = max(1, args.prompts // 10)
        cfg.natural = f"prose:{args.prompts - cfg.random}"
    if args.cap is not None:
        if args.cap <= 0:
            raise SipitError("--cap must be positive seconds")
        cfg.bruteforce_seconds = cfg.hardprompts_seconds = args.cap
    run(cfg, args.output, command="sipit " + " ".join(sys.argv[1:]))
    return 0
