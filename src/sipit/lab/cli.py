"""`sipit lab enumerate|train|counterexamples|guarantee`: parse, run, print a summary.

The main CLI calls `add_lab_parser(subparsers)`; each subcommand sets `fn` to its handler."""
from __future__ import annotations

import argparse
from dataclasses import fields, replace

from .counterexamples import CounterexampleConfig, catalogue, run_counterexamples
from .enumerate import EnumerationConfig, run_enumeration
from .guarantee import GuaranteeConfig, run_guarantee
from .models import ACTIVATIONS, ARCHS, LabModel
from .report import ids
from .train import OPTIMIZERS, TrainConfig, run_train


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _model_args(p: argparse.ArgumentParser, default: LabModel):
    g = p.add_argument_group("model", "the tiny decoder (defaults shown for this experiment)")
    g.add_argument("--arch", choices=list(ARCHS), help=f"gpt2 = LayerNorm + learned positions, llama = RMSNorm + "
                   f"rotary (default {default.arch})")
    g.add_argument("--vocab", type=int, help=f"tokens V (default {default.vocab})")
    g.add_argument("--context", type=int, help=f"longest prompt K; all prompts of length 1..K are used (default {default.context})")
    g.add_argument("--positions", type=int, help=f"model positions, >= K (+1 with BOS) (default {default.positions})")
    g.add_argument("--width", type=int, help=f"d_model (default {default.width})")
    g.add_argument("--depth", type=int, help=f"blocks (default {default.depth})")
    g.add_argument("--heads", type=int, help=f"attention heads (default {default.heads})")
    g.add_argument("--activation", choices=ACTIVATIONS, help=f"MLP activation (default {default.activation})")
    g.add_argument("--untied", dest="tied", action="store_const", const=False, help="untie input and output embeddings")
    g.add_argument("--bos", action="store_const", const=True, help="prepend a BOS token to every prompt")
    g.add_argument("--seed", type=int, help=f"weights seed (default {default.seed})")
    g.add_argument("--noise", type=float, help=f"N(0, noise²) added to every parameter after init (default {default.noise})")
    g.add_argument("--precision", help="fp32 (default), fp64, bf16, fp16, int8, int4, nf4, fp4")


def _model(args, default: LabModel) -> LabModel:
    return replace(default, **{f.name: getattr(args, f.name) for f in fields(LabModel)
                               if getattr(args, f.name, None) is not None})


def _common(p, out: str, tol: bool = True):
    p.add_argument("-o", "--out", default=out, help=f"output directory for result.json, report.md, plots (default {out})")
    p.add_argument("--layers", type=_ints, help="comma-separated layers (default: every block output 1..L; 0 = embeddings)")
    if tol:
        p.add_argument("--tol", type=float, default=1e-6, help="collision: distance <= tol x mean state norm (default 1e-6)")
    p.add_argument("--max-prompts", type=int, default=300_000, help="refuse larger enumerations (default 300000)")


def _print_layers(layers):
    for r in layers:
        a, b, _ = r.closest[0]
        print(f"  layer {r.layer}: {r.n_pairs:,} pairs, min distance {r.min_distance:.3e} "
              f"({r.min_relative:.2e} of mean norm) between {ids(a)} and {ids(b)}; collisions: {r.collisions:,}")
        for a, b, d in r.colliding:
            print(f"    collision {ids(a)} ≡ {ids(b)} (distance {d:.1e})")


def cmd_enumerate(args):
    cfg = EnumerationConfig(model=_model(args, LabModel()), layers=args.layers, tol=args.tol, max_prompts=args.max_prompts)
    print(f"lab enumerate: {cfg.model.describe()}")
    r = run_enumeration(cfg, args.out)
    print(f"{r.n_prompts:,} prompts (length 1..{cfg.model.context}), {r.n_pairs:,} pairs per layer")
    _print_layers(r.layers)
    print(f"{'no collision' if r.collisions == 0 else f'{r.collisions:,} colliding pairs'}; "
          f"{r.seconds:.1f}s -> {args.out}/report.md")


def cmd_train(args):
    cfg = TrainConfig(model=_model(args, LabModel()), optimizer=args.optimizer, steps=args.steps, lr=args.lr,
                      batch=args.batch, eval_every=args.eval_every, layers=args.layers, tol=args.tol,
                      max_prompts=args.max_prompts)
    print(f"lab train: {cfg.optimizer}, {cfg.steps} steps; {cfg.model.describe()}")
    r = run_train(cfg, args.out, progress=True)
    collisions = sum(sum(c.collisions) for c in r.checkpoints)
    print(f"best possible loss {r.entropy:.4f}; collisions over all checkpoints: {collisions}; "
          f"{r.seconds:.1f}s -> {args.out}/train.png")


def cmd_counterexamples(args):
    cfg = CounterexampleConfig(model=_model(args, CounterexampleConfig().model), names=args.only, layers=args.layers,
                               sigmas=args.sigmas, quant=args.quant, grid=args.grid, tol=args.tol, max_prompts=args.max_prompts)
    print(f"lab counterexamples: {cfg.model.describe()}")
    r = run_counterexamples(cfg, args.out)
    for item in r.items:
        print(f"{item.name}: {item.found:,} colliding pairs over layers "
              f"({', '.join(f'L{x.layer}: {x.collisions:,}' for x in item.before)})")
        for layer in item.before:
            for a, b, _ in layer.colliding[:2]:
                print(f"    layer {layer.layer}: {ids(a)} ≡ {ids(b)}")
        after = ", ".join(f"σ={s:g}: {sum(x.collisions for x in rs):,}" for s, rs in item.after)
        gone = f"removed at σ={item.removed_at:g}" if item.removed_at is not None else "NOT removed by perturbation"
        print(f"    after perturbation: {after} -> {gone}")
    print(f"{r.seconds:.1f}s -> {args.out}/report.md")


def cmd_guarantee(args):
    cfg = GuaranteeConfig(model=_model(args, GuaranteeConfig().model), layers=args.layers, eps=args.eps,
                          max_prompts=args.max_prompts)
    print(f"lab guarantee: {cfg.model.describe()}")
    r = run_guarantee(cfg, args.out)
    for x in r.layers:
        print(f"  layer {x.layer}: recovered {x.recovered:,}/{x.n_prompts:,}, max steps {x.max_steps} "
              f"(bound K·|V| = {r.bound}; max steps/(T·|V|) = {x.max_steps_ratio:.3f}), mean {x.mean_steps:.2f}, "
              f"closest rejected candidate {x.min_wrong_relative:.2e} of ‖h‖; {x.seconds:.1f}s")
    print(f"inverter {r.inverter}: guarantee {'holds' if r.holds else 'FAILS'}; {r.seconds:.1f}s -> {args.out}/report.md")


def add_lab_parser(subparsers) -> argparse.ArgumentParser:
    """Register `lab enumerate (alias exhaustive)|train|counterexamples|guarantee` on an argparse subparsers object."""
    lab = subparsers.add_parser("lab", help="theory lab: check the paper's theorems over every prompt of a tiny model")
    sub = lab.add_subparsers(dest="lab_command", required=True)

    s = sub.add_parser("enumerate", aliases=["exhaustive"], help="all prompts of length 1..K: exact minimum pairwise distance per layer (Thm 2.2)")
    _model_args(s, LabModel())
    _common(s, "runs/lab-enumerate")
    s.set_defaults(fn=cmd_enumerate)

    s = sub.add_parser("train", help="train on next-token prediction and track the exhaustive minimum distance (Thm 2.3)")
    _model_args(s, LabModel())
    _common(s, "runs/lab-train")
    s.add_argument("--optimizer", choices=list(OPTIMIZERS), default="adam", help="gd (full batch), sgd, adam (default)")
    s.add_argument("--steps", type=int, default=500)
    s.add_argument("--lr", type=float, help="learning rate (default: gd/sgd 0.1, adam 3e-3)")
    s.add_argument("--batch", type=int, default=64, help="sequences per step for sgd/adam (default 64)")
    s.add_argument("--eval-every", type=int, default=25, help="steps between exhaustive checks (default 25)")
    s.set_defaults(fn=cmd_train)

    s = sub.add_parser("counterexamples", help="models that break a hypothesis: their collisions, then a perturbation")
    _model_args(s, CounterexampleConfig().model)
    _common(s, "runs/lab-counterexamples")
    s.add_argument("--only", type=lambda t: t.split(","), help=f"comma-separated subset of: {', '.join(catalogue())}")
    s.add_argument("--sigmas", type=_floats, default=CounterexampleConfig().sigmas,
                   help="perturbation scales, comma-separated (default 1e-5,1e-4,1e-3,1e-2)")
    s.add_argument("--quant", default="float8_e4m3fn", help="torch dtype of the quantized-states counterexample")
    s.add_argument("--grid", type=float, default=6.0,
                   help="quantized-weights counterexample: grid step in units of each matrix's mean |w|")
    s.set_defaults(fn=cmd_counterexamples)

    s = sub.add_parser("guarantee", help="invert every prompt with exhaustive SipIt: 100%% recovery in <= T·|V| steps (Thm 3.1)")
    _model_args(s, GuaranteeConfig().model)
    _common(s, "runs/lab-guarantee", tol=False)
    s.add_argument("--eps", type=float, default=1e-5, help="acceptance radius relative to ‖h_t‖ (default 1e-5)")
    s.set_defaults(fn=cmd_guarantee)
    return lab
