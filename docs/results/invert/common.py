"""What the measurement scripts of this folder share (those since 692fd15): SmolLM2's learned ranker at a layer
(full calibration, cached), and the bench prompts of a seed with their states. 2 threads, as every number here."""
import statistics
import time

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
SOURCES = ["prose", "code", "random", "chat"]


def smollm2():
    return load_model("smollm2")


def ranker_at(lm, layer: int, calibration: str = "full"):
    """(the tap at layer, its LinearRanker from the calibration of that mode, full by default)."""
    engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config(calibration)), eps=1e-4)
    return LayerTap(lm, layer), engine.policy.ranker


def bench_prompts(lm, tap, seed: int, per_source: int = 10):
    """The bench's prompts of a seed (per_source of each SOURCE, 20 tokens): ([(source, ids)], ids [n, 20],
    float32 states at the tap, a list of [20, d])."""
    data = prompts(lm, SOURCES, per_source, 20, seed)
    ids = torch.tensor([p for _, p in data])
    return data, ids, [s.float() for s in tap.states(ids)]


def lockstep_engine(layer: int, B: int, seed: int):
    """SmolLM2's learned engine at a layer (full calibration) and the first B bench prompts of a seed (10 a source, 20
    tokens, in the bench's source order), inverted together once to warm up: (tap, ids [B, 20], states [B, 20, d],
    engine)."""
    from sipit.invert.eps import tolerance_for

    lm = smollm2()
    tap = LayerTap(lm, layer)
    ids = torch.tensor([p for _, p in prompts(lm, SOURCES, 10, 20, seed)])[:B]
    states = tap.states(ids)
    engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
                   eps=tolerance_for(tap, {states.dtype}).eps)
    engine.invert_prompts(list(states))
    return tap, ids, states, engine


def position1(layer: int, seeds: list[int]):
    """SmolLM2's ranker at a layer, the calibration's ids, and position 1 of the bench prompts of seeds (the scripts on
    position 1's statistics): (lm, tap, ranker, calibration ids [N, S], [bench_prompts per seed], true ids [n],
    states at positions 0 and 1, [n, d] each)."""
    from sipit.invert.learned.config import LearnedConfig
    from sipit.invert.learned.data import calibration_ids

    lm = smollm2()
    tap, rk = ranker_at(lm, layer)
    cfg = LearnedConfig()
    ids = calibration_ids(lm, cfg.sizes(lm.d_model, lm.vocab_size)[0], cfg.seq_len, cfg.random_fraction)
    tests = [bench_prompts(lm, tap, seed) for seed in seeds]
    truth = torch.cat([p[:, 1] for _, p, _ in tests])
    H0, H1 = (torch.cat([torch.stack([s[i] for s in st]) for _, _, st in tests]) for i in (0, 1))
    return lm, tap, rk, ids, tests, truth, H0, H1


def median_ms(f, repeats: int = 7) -> float:
    """Median milliseconds of f() over repeats calls."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def alternate(layer: int, seed: int, length: int, settings: dict, per_source: int = 2, repeats: int = 2,
              B: int = 1) -> None:
    """The bench prompts of a seed at a length (per_source of each SOURCE) inverted by one learned engine under
    each setting in turn, alternating in one process, every inversion exact and `ok`; prints per setting the
    median (mean) ratio to the forward, tokens and passes a prompt, seconds in passes. settings: {name:
    apply(engine)}. B > 1: lock-step batches of B (bench order, sources interleaved), the ratio to their
    batched forward, passes the most a prompt of the batch took. Model and calibration: MODEL (smollm2), CAL
    (full)."""
    import os

    from sipit.bench.invert import _forward_seconds, interleaved
    from sipit.invert.eps import tolerance_for

    model = os.environ.get("MODEL", "smollm2")
    lm = load_model(model)
    tap = LayerTap(lm, layer)
    data = prompts(lm, SOURCES, per_source, length, seed)
    ids = torch.tensor([p for _, p in data])
    states = tap.states(ids)
    engine = SipIt(lm, layer, InvertConfig(learned=calibration_config(os.environ.get("CAL", "full"))),
                   eps=tolerance_for(tap, {states.dtype}).eps)
    engine.invert_prompt(states[0])  # warm-up
    ratios, tokens, calls, in_passes = ({name: [] for name in settings} for _ in range(4))
    order = interleaved(data)
    for _ in range(repeats):
        for g in [order[i:i + B] for i in range(0, len(order), B)]:
            fwd = _forward_seconds(tap, ids[g])
            for name, apply in settings.items():
                apply(engine)
                t = time.perf_counter()
                rs = engine.invert_prompts([states[i] for i in g], [ids[i].tolist() for i in g])
                assert all(r.exact and r.status == "ok" for r in rs), name
                ratios[name].append((time.perf_counter() - t) / fwd)
                tokens[name].append(sum(r.forward_tokens for r in rs) / len(g))
                calls[name].append(max(r.tap_calls for r in rs))
                in_passes[name].append(sum(r.pass_seconds for r in rs) / len(g))
    for name in settings:
        print(f"{model} layer {layer} seed {seed} length {length} B {B}, {name}: median ratio "
              f"{statistics.median(ratios[name]):.2f} (mean {statistics.mean(ratios[name]):.2f}), tokens "
              f"{statistics.mean(tokens[name]):.0f}, passes {statistics.mean(calls[name]):.1f} a prompt, "
              f"{statistics.mean(in_passes[name]):.3f} s in passes", flush=True)


def calibration_field(name: str, on: bool, kept: dict, describe=lambda cal: ""):
    """A setting for `alternate`: the engine's Calibration.<name> as fitted (on) or None (off), the fitted value
    kept in `kept` (shared by the two settings of a field) the first time, when describe(cal) is printed."""
    def apply(engine):
        cal = engine.policy.ranker.cal
        if name not in kept:
            kept[name] = getattr(cal, name)
            print(describe(cal), flush=True)
        setattr(cal, name, kept[name] if on else None)
    return apply


def module_before(commit: str, name: str):
    """sipit/invert/learned/<name>.py as it was at an earlier commit, as a module (an earlier ranker or calibration
    beside the current ones, in one process)."""
    import subprocess
    import sys
    import types

    source = subprocess.check_output(["git", "show", f"{commit}:src/sipit/invert/learned/{name}.py"], text=True)
    module = types.ModuleType(f"sipit.invert.learned.{name}_before")
    module.__package__ = "sipit.invert.learned"
    sys.modules[module.__name__] = module  # (dataclasses look their module up)
    exec(compile(source, f"{name}.py@{commit}", "exec"), module.__dict__)
    return module


def with_screen_rank(ranker, basis, rank: int) -> None:
    """The ranker's calibration screened at `rank` columns of basis [d, d] (P's principal basis, as fit._screening
    makes it), the rest of the calibration unchanged."""
    cal = ranker.cal
    cal.p_basis = basis[:, :rank].contiguous()
    cal.p_proj = cal.P.float() @ cal.p_basis
    ranker.use_screen()
