"""The `sipit` command: parse, call the Python API, print or write results. Nothing else."""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

from .io import SipitError

BENCHMARKS = ("tap", "pairwise", "invert", "exhaustive")
DEVICE_HELP = "auto (default: cuda when available, else cpu), cpu, cuda, cuda:N or mps"
DEMO_TEXT = "The quick brown fox jumps over the lazy dog while the old farmer watches from the porch."


def cmd_models(args):
    from .models import embedded_status

    for name, s in embedded_status().items():
        state = "installed" if s["installed"] else f"not installed ({s['install']})"
        print(f"{name:24s} {state:40s} {s['description']}")


def cmd_corpora(args):
    from .corpora import CORPORA, SPEC_HELP, available

    for name, ok in available().items():
        print(f"{name:10s} {'available' if ok else 'not installed':14s} {CORPORA[name][0]}")
    print(f"\nA corpus spec is a comma-separated list of {SPEC_HELP}.")


def cmd_robustness(args):
    from .corpora import sample
    from .environment import load_average
    from .invert.robust import RobustConfig, plot, run
    from .io import write_json
    from .models import load_model

    lm = load_model(args.model, precision=args.precision, device=args.device)
    ids = [p.ids for p in sample(args.corpus, lm.tokenizer, args.length, seed=args.seed,
                                  vocab_size=lm.vocab_size)]
    cfg = RobustConfig(sigmas=tuple(float(x) for x in args.sigmas.split(",")), trials=args.trials,
                       candidates=args.candidates, batch_size=args.batch_size, seed=args.seed)
    res = run(lm, ids, args.layer, cfg, final_norm=args.final_norm, progress=not args.quiet)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    d = res.to_dict()
    d["summary"].update(precision=lm.precision, corpus=args.corpus, length=args.length,
                        threads=torch.get_num_threads(), load=load_average())
    write_json(out / "results.json", d)
    plot(res, out / "recovery_vs_noise.png")
    s = d["summary"]
    kind = "certified" if res.exhaustive else "UPPER BOUND (candidate subset)"
    print(f"{s['prompts']} prompts, layer {res.layer} of {lm.name} ({lm.precision}); {kind} relative radius "
          f"min {s['radius_rel_min']:.4g} median {s['radius_rel_median']:.4g}, absolute min {s['radius_abs_min']:.4g}")
    print("  sigma       exact   certified")
    for r in s["curve"]:
        print(f"  {r['sigma']:<10g} {r['exact_rate']:6.3f}   {r['certified_rate']:6.3f}")
    print(f"{s['seconds']}s -> {out}")


def cmd_demo(args):
    from .capture import capture
    from .invert import InvertConfig, invert
    from .invert.learned.config import calibration_config
    from .models import DEFAULT_MODEL, load_model
    from .states import load_states, save_states

    t = time.perf_counter()
    lm = load_model(args.model or DEFAULT_MODEL, device=args.device)
    layer = lm.n_layers // 2
    print(f"model {lm.name}: {lm.n_layers} layers, d={lm.d_model}, V={lm.vocab_size} "
          f"(loaded in {time.perf_counter() - t:.1f}s)")
    ids = lm.encode(args.text)
    t = time.perf_counter()
    states = capture(lm, [ids], layer)
    forward = time.perf_counter() - t
    path = save_states(Path(args.out) / "demo_states.safetensors", states, model=lm.name, layer=layer,
                       final_norm=False, tokenizer=lm.tokenizer_fingerprint, ids=[ids])
    print(f"captured layer {layer} states of {len(ids)} tokens in {forward:.2f}s (one forward pass) -> {path}")
    st = load_states(path)
    result = invert(lm, st.prompts, layer, InvertConfig(learned=calibration_config(args.calibration)), progress=True)
    p = result.prompts[0]
    print(f"original : {args.text!r}")
    print(f"recovered: {p.text!r}  [{p.status}; {'exact' if p.ids == ids else 'NOT exact'}]")
    print(f"inversion: {p.seconds:.2f}s ({p.seconds / forward:.1f}x the capture pass), "
          f"{sum(q.tried for q in p.positions)} candidates verified for {len(ids)} positions; "
          f"one-time {args.calibration} calibration {result.summary()['calibration_seconds']}s")
    return 0 if p.ids == ids else 1


def _print_layers(series: list[dict]) -> None:
    for s in series:
        print(f"{s['label']}: {s['n']:,} states, {s['n_pairs']:,} pairs per layer")
        print("  layer   min distance   relative   pairs<=thr  structural")
        for r in s["layers"]:
            d, rel = r["min_distance"], r["min_relative"]
            print(f"  {r['layer']:5d}   {'—' if d is None else f'{d:12.5g}'}   {'—' if rel is None else f'{rel:8.2e}'}"
                  f"   {r['below_threshold']:10d}  {r['structural']['pairs']:10d}")


def _length(args) -> int | None:
    from .corpora import default_length

    return args.length if args.length is not None else default_length(args.corpus)


def cmd_collisions(args):
    from .collisions.sampled import SampledConfig, run
    from .engines import make_engine
    from .models import load_model

    lm = load_model(args.model, precision=args.precision, device=args.device)
    cfg = SampledConfig(corpus=args.corpus, length=_length(args), layers=args.layers, seed=args.seed,
                        final_norm=args.final_norm, threshold=args.threshold, keep=args.keep,
                        batch_size=args.batch_size)
    res = run(lm, cfg, args.output, progress=not args.quiet, engine=make_engine(args.engine, args.workers))
    _print_layers(res.to_dict()["series"])
    print(f"states {res.seconds['states']:.1f}s, pairwise {res.seconds['pairwise']:.1f}s, "
          f"this run {res.seconds['this_run']:.1f}s (load {res.load['start']}) -> {args.output}")


def cmd_exhaustive(args):
    from .collisions.append_all import ExhaustiveConfig, run
    from .engines import make_engine
    from .models import load_model

    lm = load_model(args.model, precision=args.precision, device=args.device)
    cfg = ExhaustiveConfig(prefixes=args.prefixes, layers=args.layers, source=args.source, corpus=args.corpus,
                           length=_length(args), seed=args.seed, final_norm=args.final_norm,
                           threshold=args.threshold, keep=args.keep, batch_size=args.batch_size,
                           keep_states=args.keep_states)
    res = run(lm, cfg, args.output, progress=not args.quiet, engine=make_engine(args.engine, args.workers))
    _print_layers(res.to_dict()["series"])
    for k, layers in enumerate(res.layers):
        st = layers[0]["structural"]
        if st["pairs"]:
            groups = "; ".join(" = ".join(f"{t['id']}:{t['text']!r}" for t in g) for g in st["tokens"])
            print(f"prefix {k}: {st['pairs']} structural pairs (identical embedding rows): {groups}")
    print(f"states {res.seconds['states']:.1f}s, pairwise {res.seconds['pairwise']:.1f}s, "
          f"this run {res.seconds['this_run']:.1f}s (load {res.load['start']}) -> {args.output}")


def cmd_report(args):
    from .report import report

    rep = report(args.dir)
    print(rep.table, end="")
    print("wrote " + ", ".join(str(p) for p in rep.files))


def cmd_bench(args, rest):
    names = BENCHMARKS if args.name == "all" else [args.name]
    for name in names:
        module = importlib.import_module(f"sipit.bench.{name}")
        device = ["--device", args.device] if getattr(module, "TAKES_DEVICE", False) else []
        module.main([*rest, "--threads", str(args.threads), *device])


def add_model(parser, default="smollm2"):
    from .models import PRECISIONS

    parser.add_argument("--model", default=default,
                        help="embedded name (smollm2, gemma3-270m), .gguf file, HF id or directory, tiny-gpt2/tiny-llama")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="weights/activations format or weight quantization (default fp32)")


def build_parser() -> argparse.ArgumentParser:
    from .engines import add_engine_options
    from .invert.learned.cli import add_cache_parser, add_calibrate_parser, add_calibration_option

    p = argparse.ArgumentParser(prog="sipit", allow_abbrev=False, description="Invert language-model hidden states and test injectivity.")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("models", help="list embedded models and whether each is installed")
    s.set_defaults(fn=cmd_models)

    s = sub.add_parser("corpora", help="list the named prompt corpora (use as --corpus NAME:N)")
    s.set_defaults(fn=cmd_corpora)

    from .capture_cli import add_capture_parser

    add_capture_parser(sub, add_model)

    from .identify_cli import add_identify_parser

    add_identify_parser(sub)

    from .invert.cli import add_invert_parser

    add_invert_parser(sub)

    s = sub.add_parser("reproduce", help="the paper's inversion tables at our scale, next to the paper's numbers")
    s.add_argument("--quick", action="store_true", help="a few prompts and short caps (about 5 minutes)")
    s.add_argument("--model", default=None, help="model of the inversion and sweep tables (default smollm2)")
    s.add_argument("--prompts", type=int, default=None,
                   help="prompts of the inversion table, 90%% prose and 10%% (at least 1) random ids (default 10)")
    s.add_argument("--cap", type=float, default=None,
                   help="wall-clock cap per prompt, seconds, for HardPrompts and BruteForce (default 600)")
    s.add_argument("-o", "--output", required=True, help="directory for tables.md and results.json")
    s.set_defaults(fn=lambda args: __import__("sipit.reproduce", fromlist=["main"]).main(args))

    s = sub.add_parser("robustness", help="certified noise radius (Theorem 3.2) and exact recovery vs noise")
    add_model(s)
    s.add_argument("--layer", type=int, required=True)
    s.add_argument("--final-norm", action="store_true")
    s.add_argument("--corpus", default="prose:10", help="corpus spec NAME:N,... (default prose:10)")
    s.add_argument("--length", type=int, default=20, help="tokens per prompt (default 20)")
    s.add_argument("--sigmas", default="0,0.001,0.003,0.01,0.03,0.1,0.3,1", help="relative noise levels")
    s.add_argument("--trials", type=int, default=4, help="noisy copies per prompt and sigma")
    s.add_argument("--candidates", type=int, default=None,
                   help="k: only policy top-k + k random tokens per position (margins become upper bounds); "
                        "default every token")
    s.add_argument("--batch-size", type=int, default=512)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("-q", "--quiet", action="store_true")
    s.add_argument("-o", "--output", required=True, help="output dir: results.json, recovery_vs_noise.png")
    s.set_defaults(fn=cmd_robustness)

    s = sub.add_parser("demo", help="capture a sample prompt on the default model and invert it")
    s.add_argument("--model", default=None)
    s.add_argument("--text", default=DEMO_TEXT)
    s.add_argument("--out", default="out", help="directory for the demo's files (default ./out)")
    # fast: a fresh machine's first run calibrates in well under a minute (full: the sharper ranker)
    add_calibration_option(s, default="fast")
    s.set_defaults(fn=cmd_demo)

    def collision_options(s, layers_default, layers_help, batch):
        add_model(s)
        s.add_argument("--layers", default=layers_default, help=layers_help)
        s.add_argument("--length", type=int, default=None,
                       help="tokens per sampled prompt (default 20; a corpus file without a count: its lines as they are)")
        s.add_argument("--seed", type=int, default=0, help="prompt sampling seed")
        s.add_argument("--final-norm", action="store_true", help="states after the model's final norm")
        s.add_argument("--threshold", type=float, default=1e-6, help="collision threshold on the L2 distance (default 1e-6)")
        s.add_argument("--keep", type=int, default=20, help="closest pairs reported per layer (default 20)")
        s.add_argument("--batch-size", type=int, default=batch, help=f"states per forward pass (default {batch})")
        s.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
        s.add_argument("-o", "--output", required=True, help="run directory (rerun with the same options to resume)")
        add_engine_options(s)

    s = sub.add_parser("collisions", help="minimum pairwise distance of last-token states of sampled prompts, per layer")
    collision_options(s, "all", "'all' (default) or a list like 1,15,-1", 64)
    s.add_argument("--corpus", default="prose:2000,code:2000,random:1000",
                   help="corpus spec, comma-separated: NAME:N (see `sipit corpora`), FILE.txt:N (N spans of "
                        "--length tokens) or FILE.txt (every line as a prompt); .jsonl files too")
    s.set_defaults(fn=cmd_collisions)

    s = sub.add_parser("exhaustive", help="append every vocabulary token to the closest prefixes and compare all pairs")
    collision_options(s, None, "'all' or a list like 1,15,-1 (default: 1, L/2, L)", 512)
    s.add_argument("--prefixes", type=int, default=1, help="K: prefixes to test (default 1)")
    s.add_argument("--from", dest="source", default=None, help="a `sipit collisions` run dir to take the prefixes from")
    s.add_argument("--corpus", default="prose:200,code:200,random:100",
                   help="without --from: prompts sampled to choose the prefixes (default prose:200,code:200,random:100)")
    s.add_argument("--keep-states", action="store_true", help="keep the V x d state chunks after the analysis")
    s.set_defaults(fn=cmd_exhaustive)

    s = sub.add_parser("report", help="tables (table.md) and PNG plots of a collisions or exhaustive run dir")
    s.add_argument("dir")
    s.set_defaults(fn=cmd_report)

    from .lab.cli import add_lab_parser

    add_lab_parser(sub)

    add_calibrate_parser(sub, add_model)
    add_cache_parser(sub)

    from .audit.cli import add_audit_parser

    add_audit_parser(sub)

    s = sub.add_parser("bench", help=f"run a benchmark and print JSON: {', '.join(BENCHMARKS)} or all; "
                                      "extra arguments go to the benchmark")
    s.add_argument("name", choices=[*BENCHMARKS, "all"])
    s.set_defaults(fn=cmd_bench, passthrough=True)
    _threads_after_command(p)
    return p


def _threads_after_command(parser: argparse.ArgumentParser) -> None:
    """Accept `--threads N` and `--device D` after any (sub)command too: `sipit demo --threads 2` =
    `sipit --threads 2 demo`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for s in action.choices.values():
                s.allow_abbrev = False  # `bench pairwise --d 4096` must not be read as --device
                if "--threads" not in s._option_string_actions:
                    s.add_argument("--threads", type=int, default=argparse.SUPPRESS, help="torch threads (default 2)")
                if "--device" not in s._option_string_actions:
                    s.add_argument("--device", default=argparse.SUPPRESS, help=DEVICE_HELP)
                _threads_after_command(s)


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    torch.set_num_threads(args.threads)
    try:
        from .models import resolve_device

        args.device = str(resolve_device(args.device))
        code = args.fn(args, rest) if getattr(args, "passthrough", False) else args.fn(args)
    except SipitError as e:
        print(f"sipit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sipit: interrupted", file=sys.stderr)
        return 130
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
