"""`sipit audit`: does this leak the prompt, and what would stop it?

    cfg = AuditConfig(model="tiny-llama", layers="1,4", defenses="none,noise:0.01,0.1,quant:int8")
    report = run(lm, cfg, "out/audit")          # -> report.json, index.html, *.png in out/audit
    report["layers"]["4"]["verdict"]

For every (surface, layer, defence) a *cell* holds the attack, the utility cost and the defence;
every layer holds its geometry (collisions, margins, certified noise radius) and a one-sentence
verdict. Cells are written atomically under DIR/cells/ as they finish: a rerun with the same
options skips them (a different config in DIR is refused, see collisions.common.open_run_dir).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..collisions.common import cached_json, open_run_dir, parse_layers
from ..capture import SurfaceSpec
from ..corpora import sample
from ..environment import load_average
from ..invert.robust import RobustConfig
from ..io import SipitError, read_json, write_json
from ..models import LM
from ..models.sae import sae_layer
from . import measure
from .defenses import Defense, parse_defenses
from .surfaces import check_defenses, make_surface, parse_surface, spec_name

# the default: a noise sweep and the commonest storage format; fp8 and int4 on request (each costs a
# quarter of the default run at SmolLM2's deep layers, mostly certifying position 0 under their large ε)
DEFAULT_DEFENSES = "none,noise:0.001,0.01,0.03,0.1,0.3,1,3,10,quant:int8"
SAE_DEFENSES = "none,quant:int8,int4,fp8"  # an SAE's latents: storage formats (surfaces.check_defenses)


@dataclass
class AuditConfig:
    model: str = "smollm2"
    layers: str = "default"  # 'default' (1, L/2, L), 'all' or '1,8,15'
    surface: str = "states"  # states | kv[:keys|values|both] | logits | projection:K[:gaussian|pca|coords] | sae:DIR
    defenses: str = DEFAULT_DEFENSES
    prompts: str = "prose:8,code:2"  # corpus spec NAME:N,... or a .txt file (one prompt per line)
    length: int = 20  # tokens per corpus prompt
    policy: str = "learned"  # SipIt's candidate ordering (invert/policies.py)
    candidates: int | None = 16  # noise attack: policy top-k + k random per position; None = every token
    exhaustive_below: int = 4096  # ... but every token (a certified radius) when the vocabulary is this small
    max_candidates: int | None = 1024  # SipIt attacks: per position, then the prompt counts as not recovered
    #   (a coarse format's ε admits a wrong token, after which no token fits: a search of the whole
    #   vocabulary at every later position; None = no cap)
    trials: int = 4  # noisy copies per prompt and sigma
    geometry_prompts: int = 200  # sampled prompts for the collision test
    utility_text: str = "tech:8"  # held-out corpus for the utility cost
    utility_length: int = 64
    seed: int = 0


def resolve(lm: LM, cfg: AuditConfig) -> tuple[list[int], SurfaceSpec, list[Defense]]:
    """Validate the options against the model: layers, surface, defences. Raises SipitError."""
    for name, value, low in (("trials", cfg.trials, 1), ("candidates", cfg.candidates or 1, 1),
                             ("max-candidates", cfg.max_candidates or 1, 1),
                             ("geometry-prompts", cfg.geometry_prompts, 4), ("length", cfg.length, 1),
                             ("utility-length", cfg.utility_length, 2)):
        if value < low:
            raise SipitError(f"--{name} must be at least {low}, got {value}")
    from ..invert.policies import POLICIES

    if cfg.policy not in POLICIES:
        raise SipitError(f"unknown policy {cfg.policy!r}: use one of {', '.join(POLICIES)}")
    L = lm.n_layers
    kind = cfg.surface.split(":")[0]
    if cfg.layers != "default":
        layers = parse_layers(cfg.layers, lm)
    elif kind == "sae":  # the layer its hook reads
        layers = [sae_layer(SurfaceSpec.parse(cfg.surface).sae)]
        if layers[0] is None:
            raise SipitError("the SAE's hook names no residual-stream layer: give --layers")
    else:
        layers = [L] if kind == "logits" else sorted({1, L // 2, L})  # logits: one layer, the last
    spec = parse_surface(lm, cfg.surface, layers)
    defaults = kind == "sae" and cfg.defenses == DEFAULT_DEFENSES  # (no noise on an SAE's latents)
    defenses = parse_defenses(SAE_DEFENSES if defaults else cfg.defenses, lm.d_model)
    check_defenses(lm, spec, defenses)
    return layers, spec, defenses


def load_prompts(lm: LM, cfg: AuditConfig) -> list[list[int]]:
    """The attacked prompts: a .txt file (one per line, encoded) or a corpus spec."""
    path = Path(cfg.prompts)
    if path.suffix == ".txt" or path.is_file():
        if not path.is_file():
            raise SipitError(f"prompt file not found: {path}")
        prompts = [lm.encode(line) for line in path.read_text().splitlines() if line.strip()]
        if not prompts:
            raise SipitError(f"{path} has no non-empty lines")
        return prompts
    return [p.ids for p in sample(cfg.prompts, lm.tokenizer, cfg.length, seed=cfg.seed, vocab_size=lm.vocab_size)]


def run(lm: LM, cfg: AuditConfig, out_dir: str | Path, progress: bool = True, engine=None) -> dict:
    """Every cell of the audit (resuming those already in out_dir), then report.json, PNGs and index.html.

    engine: sipit.engines' local (None) or ray: the missing robustness and defence cells as its tasks."""
    from tqdm.auto import tqdm

    from .html import write_page

    out = Path(out_dir)
    if lm.tokenizer is None:  # (the geometry's prompts are half prose, the utility's text is text)
        raise SipitError(f"{lm.name} has no tokenizer (ids only): an audit samples prose prompts and measures a "
                         "defence's cost on text; audit the model with its tokenizer, or attack ids with sipit capture "
                         "--ids and sipit invert / sipit robustness --corpus random:N")
    layers, spec, defenses = resolve(lm, cfg)
    prompts = load_prompts(lm, cfg)
    surfaces = {layer: make_surface(lm, spec, layer, prompts, cfg.seed) for layer in layers}  # errors before writing
    t0 = time.perf_counter()
    calibration_seconds = 0.0  # this run's share: 0 when every calibration was cached
    if cfg.policy == "learned":  # every missing calibration (each layer's surface, project:k taps) in one pass
        from ..invert.learned.fit import calibrate_cached_taps

        fitted = calibrate_cached_taps(lm, [s.tap_for(d, cfg.seed) for s in surfaces.values() for d in defenses])
        calibration_seconds = sum(fitted.values())
    # the weights' fingerprint is part of the config: cells of other weights are never reused
    open_run_dir(out, "audit", dict(asdict(cfg), fingerprint=lm.fingerprint), dict(model=lm.name, n_layers=lm.n_layers))
    geo_prompts = [p.ids for p in sample(f"prose:{cfg.geometry_prompts // 2},random:{cfg.geometry_prompts // 2}",
                                         lm.tokenizer, cfg.length, seed=cfg.seed + 1)]
    held = torch.tensor([p.ids for p in sample(cfg.utility_text, lm.tokenizer, cfg.utility_length,
                                               seed=cfg.seed + 2)], device=lm.device)
    clean = measure.next_token(lm, held)
    sigmas = [d.param for d in defenses if d.family == "noise"]
    V = lm.vocab_size
    rcfg = RobustConfig(trials=cfg.trials, policy=cfg.policy, seed=cfg.seed,
                        candidates=None if V <= cfg.exhaustive_below else cfg.candidates)
    inputs = CellInputs(prompts, held, clean, sigmas, rcfg)
    if engine is not None and engine.name != "local":  # the missing cells on the engine; the loop reads them
        _cells_on(engine, lm, cfg, inputs, layers, defenses, out, spec_name(spec), progress)
    cells, per_layer = [], {}
    bar = tqdm(total=len(layers) * (len(defenses) + 2), desc=f"audit {lm.name}", unit="cell", disable=not progress)
    for layer in layers:
        surface = surfaces[layer]
        geo = cached_json(cell_path(out, surface.name, layer, "geometry"), lambda: measure.collisions(
            lm, geo_prompts, surface.input_layer, measure.last_token_observations(surface.tap, geo_prompts)))
        bar.update()
        rob = cached_json(cell_path(out, surface.name, layer, "robustness"),
                          lambda: compute_cell(lm, cfg, inputs, layer, "robustness", progress=progress, surface=surface))
        bar.update()
        for defense in defenses:
            bar.set_postfix_str(f"L{layer} {defense.name}")
            cells.append(cached_json(cell_path(out, surface.name, layer, defense.name),
                                     lambda: compute_cell(lm, cfg, inputs, layer, defense, rob, surface=surface)))
            bar.update()
        layer_cells = [c for c in cells if c["layer"] == layer]
        per_layer[str(layer)] = dict(leaks=surface.leaks, observed_through=surface.tap.key, geometry=geo,
                                     margins=rob["margins"],
                                     verdict=verdict(layer, layer_cells, rob["margins"]))
    bar.close()
    report = dict(kind="audit", surface=spec_name(spec), utility_note=surfaces[layers[0]].utility_note, model=lm.name,
                  fingerprint=lm.fingerprint, n_layers=lm.n_layers, d_model=lm.d_model,
                  vocab_size=V, config=asdict(cfg), layers_audited=layers, defenses=[x.name for x in defenses],
                  prompts=len(prompts), prompt_lengths=sorted({len(p) for p in prompts}),
                  utility_tokens=int(held.numel()), layers=per_layer, cells=cells,
                  seconds_this_run=round(time.perf_counter() - t0, 2), calibration_seconds_this_run=round(calibration_seconds, 1),
                  threads=torch.get_num_threads(),
                  load=load_average())
    write_json(out / "report.json", report)
    write_page(report, out)
    return report


@dataclass
class CellInputs:
    """What an audit's cells read besides the model and config (picklable: engine tasks get it)."""

    prompts: list[list[int]]  # the attacked prompts
    held: torch.Tensor  # [B, T] held-out ids for the utility cost
    clean: tuple[float, torch.Tensor]  # their undefended cross-entropy and top-1 ids [B, T-1]
    sigmas: list[float]  # the noise defences' sigmas
    rcfg: RobustConfig


def cell_path(out: Path, surface: str, layer: int, name: str) -> Path:
    """Where a layer's cell is kept: geometry, robustness or a defence's name (surface: canonical name)."""
    return out / "cells" / surface.replace(":", "_") / f"L{layer:03d}" / f"{name.replace(':', '_')}.json"


def compute_cell(lm: LM, cfg: AuditConfig, inputs: CellInputs, layer: int, what, rob: dict | None = None,
                 progress: bool = False, surface=None) -> dict:
    """The JSON of one cell at `layer`: what = "robustness" (the noise sweep and margins) or a
    Defense (its attack and utility cost; a noise defence reads the layer's robustness `rob`).
    surface: the layer's Surface (default: made from cfg, as an engine task does)."""
    if surface is None:
        surface = make_surface(lm, parse_surface(lm, cfg.surface, [layer]), layer, inputs.prompts, cfg.seed)
    if what == "robustness":
        return _robust_dict(*measure.robustness(lm, surface, inputs.prompts, inputs.sigmas, inputs.rcfg, progress))
    defense = what
    if defense.family == "noise":
        attack = measure.attack_noise(lm, _robust_result(rob), defense.param)
    else:
        attack = measure.attack_invert(lm, surface, defense, inputs.prompts, cfg.policy, cfg.seed, cfg.max_candidates)
    return dict(surface=surface.name, layer=layer, defense=defense.name, family=defense.family,
                strength=defense.strength, attack=attack,
                utility=measure.utility(lm, surface, defense, inputs.held, inputs.clean, cfg.seed))


def _cells_on(engine, lm: LM, cfg: AuditConfig, inputs: CellInputs, layers: list[int], defenses: list[Defense],
              out: Path, surface: str, progress: bool) -> None:
    """The missing robustness and defence cells as engine tasks, written under out/cells/; noise
    cells go after their layer's robustness, which they read."""
    from ..engines import audit_cells

    def spec(layer: int, what) -> tuple:  # a noise cell carries its layer's robustness JSON
        noise = getattr(what, "family", None) == "noise"
        return layer, what, read_json(cell_path(out, surface, layer, "robustness")) if noise else None

    first = [(layer, "robustness") for layer in layers] + \
            [(layer, d) for layer in layers for d in defenses if d.family != "noise"]
    noise = [(layer, d) for layer in layers for d in defenses if d.family == "noise"]
    for wave in (first, noise):
        paths = [cell_path(out, surface, layer, getattr(what, "name", what)) for layer, what in wave]
        audit_cells(engine, lm, cfg, inputs, [(p, spec(*w)) for p, w in zip(paths, wave) if not p.exists()], progress)


def _robust_dict(res, calibration_seconds: float) -> dict:
    """A robustness run as JSON: the summary, per-prompt numbers and the layer's margins."""
    return dict(res.to_dict(), margins=measure.margins(res, calibration_seconds))


def _robust_result(d: dict):
    """The JSON of _robust_dict back as a RobustnessResult (what attack_noise reads)."""
    from ..invert.robust import PromptRobustness, RobustnessResult

    s = d["summary"]
    cfg = RobustConfig(**{**d["config"], "sigmas": tuple(d["config"]["sigmas"])})
    return RobustnessResult(model=s["model"], layer=s["layer"], final_norm=s["final_norm"], config=cfg,
                            exhaustive=s["exhaustive"], prompts=[PromptRobustness(**p) for p in d["prompts"]],
                            seconds=s["seconds"])


def verdict(layer: int, cells: list[dict], margins: dict) -> str:
    """One sentence: how much leaks undefended, the weakest defence of each family that stops exact
    recovery (and what it costs), and the certified radius below which no noise can work."""
    base = next((c for c in cells if c["family"] == "none"), None)
    parts = [f"Layer {layer}: "]
    if base is not None:
        parts.append(f"undefended, SipIt recovers {base['attack']['exact_rate']:.0%} of prompts exactly")
    for family, label in (("noise", "noise"), ("quant", "quantization"), ("project", "projection")):
        fam = sorted((c for c in cells if c["family"] == family), key=lambda c: c["strength"])
        if not fam:
            continue
        stop = next((c for c in fam if c["attack"]["exact_rate"] == 0), None)
        if stop is None:
            parts.append(f"; no {label} tried stops it ({', '.join(c['defense'] for c in fam)})")
        else:
            u = stop["utility"]
            cost = "no utility cost measured (not a forward-pass intervention)" if u is None else \
                f"a cost of {u['delta_ce']:+.3g} nats/token (top-1 agreement {u['top1_agreement']:.0%})"
            parts.append(f"; {label} stops exact recovery by these attacks from {stop['defense']} (tokens still "
                         f"recovered: {stop['attack']['token_accuracy']:.0%}) at {cost}")
    kind = "certified" if margins["exhaustive"] else "estimated (upper bound, candidate subset)"
    parts.append(f". Noise radius ({kind}): rho = {margins['radius_rel_min']:.3g}; "
                 + ("relative noise below it provably cannot stop recovery of these prompts."
                    if margins["exhaustive"] else "noise below it is not expected to stop recovery."))
    return "".join(parts)

