"""The `sipit` command: parse, call the Python API, print or write results. Nothing else."""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

from .io import SipitError

BENCHMARKS = ("tap", "pairwise", "invert")
DEMO_TEXT = "The quick brown fox jumps over the lazy dog while the old farmer watches from the porch."


def cmd_models(args):
    from .models import embedded_status

    for name, s in embedded_status().items():
        state = "installed" if s["installed"] else f"not installed ({s['install']})"
        print(f"{name:14s} {state:40s} {s['description']}")


def cmd_corpora(args):
    from .corpora import CORPORA, available

    for name, ok in available().items():
        print(f"{name:10s} {'available' if ok else 'not installed':14s} {CORPORA[name][0]}")


def _prompts(lm, args) -> list[list[int]]:
    if args.text is not None:
        texts = [args.text]
    else:
        path = Path(args.file)
        if not path.is_file():
            raise SipitError(f"prompt file not found: {path}")
        texts = [line for line in path.read_text().splitlines() if line.strip()]
    if not texts or not all(t.strip() for t in texts):
        raise SipitError("no prompt given: --text is empty or the file has no non-empty lines")
    return [lm.encode(t) for t in texts]


def cmd_capture(args):
    from .capture import capture
    from .models import load_model
    from .states import save_states

    lm = load_model(args.model, precision=args.precision)
    layer = lm.layer_index(args.layer)
    ids = _prompts(lm, args)
    t = time.perf_counter()
    states = capture(lm, ids, layer, args.final_norm)
    save_states(args.output, states, model=args.model, layer=layer, final_norm=args.final_norm,
                tokenizer=lm.tokenizer_fingerprint, precision=lm.precision, ids=ids)
    print(f"captured {len(ids)} prompt(s), {sum(map(len, ids))} tokens, layer {layer} of {args.model} "
          f"({lm.precision}, final_norm={args.final_norm}) in {time.perf_counter() - t:.2f}s -> {args.output}")


def cmd_demo(args):
    from .capture import capture
    from .models import DEFAULT_MODEL, load_model
    from .states import load_states, save_states

    t = time.perf_counter()
    lm = load_model(args.model or DEFAULT_MODEL)
    layer = lm.n_layers // 2
    print(f"model {lm.name}: {lm.n_layers} layers, d={lm.d_model}, V={lm.vocab_size} "
          f"(loaded in {time.perf_counter() - t:.1f}s)")
    ids = lm.encode(args.text)
    t = time.perf_counter()
    states = capture(lm, [ids], layer)
    path = save_states(Path(args.out) / "demo_states.safetensors", states, model=lm.name, layer=layer,
                       final_norm=False, tokenizer=lm.tokenizer_fingerprint, ids=[ids])
    print(f"captured layer {layer} states of {len(ids)} tokens in {time.perf_counter() - t:.2f}s -> {path}")
    loaded = load_states(path)
    print(f"original : {args.text!r}")
    print(f"states   : {list(loaded.prompts[0].shape)} {loaded.prompts[0].dtype}")


def cmd_bench(args, rest):
    names = BENCHMARKS if args.name == "all" else [args.name]
    for name in names:
        importlib.import_module(f"sipit.bench.{name}").main([*rest, "--threads", str(args.threads)])


def add_precision(parser):
    from .models import PRECISIONS

    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="weights/activations format or weight quantization (default fp32)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sipit", description="Invert language-model hidden states and test injectivity.")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("models", help="list embedded models and whether each is installed")
    s.set_defaults(fn=cmd_models)

    s = sub.add_parser("corpora", help="list the named prompt corpora (use as --corpus NAME:N)")
    s.set_defaults(fn=cmd_corpora)

    s = sub.add_parser("capture", help="capture hidden states of prompts at one layer")
    s.add_argument("--model", default="smollm2", help="embedded name, .gguf file, HF id or directory, tiny-gpt2/tiny-llama")
    s.add_argument("--layer", type=int, required=True, help="0 = embeddings, i = after block i, negative from the end")
    s.add_argument("--final-norm", action="store_true", help="apply the model's final norm to the state")
    add_precision(s)
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="one prompt")
    src.add_argument("--file", help="text file, one prompt per line")
    s.add_argument("-o", "--output", required=True, help="output .safetensors file")
    s.set_defaults(fn=cmd_capture)

    s = sub.add_parser("demo", help="capture a sample prompt on the default model and invert it")
    s.add_argument("--model", default=None)
    s.add_argument("--text", default=DEMO_TEXT)
    s.add_argument("--out", default="out", help="directory for the demo's files (default ./out)")
    s.set_defaults(fn=cmd_demo)

    s = sub.add_parser("bench", help=f"run a benchmark and print JSON: {', '.join(BENCHMARKS)} or all; "
                                      "extra arguments go to the benchmark")
    s.add_argument("name", choices=[*BENCHMARKS, "all"])
    s.set_defaults(fn=cmd_bench, passthrough=True)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    torch.set_num_threads(args.threads)
    try:
        args.fn(args, rest) if getattr(args, "passthrough", False) else args.fn(args)
    except SipitError as e:
        print(f"sipit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sipit: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
