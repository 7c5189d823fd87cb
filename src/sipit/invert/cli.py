"""`sipit invert FILE`: recover the exact prompts from a states (or other surface) file."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..io import SipitError


def cmd_invert(args):
    from ..capture import open_surface
    from ..engines import invert_batch, make_engine
    from . import InvertConfig, run
    from ..io import write_json, write_jsonl
    from ..models import load_model
    from ..states import load_states

    st = load_states(args.states, args.layer, args.file_layers)
    model = args.model or st.model
    layer = args.layer if args.layer is not None else st.layer
    if model is None or layer is None:
        raise SipitError(f"{args.states} does not say which model/layer made it: give --model and --layer")
    final_norm = st.final_norm if args.final_norm is None else args.final_norm
    lm = load_model(model, precision=args.precision or st.precision or "fp32", device=args.device)
    if st.tokenizer and st.tokenizer != lm.tokenizer_fingerprint:
        print(f"sipit: warning: the states file was made with another tokenizer than {model}'s", file=sys.stderr)
    tap, prompts, error = open_surface(lm, st, lm.layer_index(layer), final_norm)
    out = Path(args.output or Path(args.states).with_suffix(".results.jsonl"))
    if args.noise:  # relative noise of norm sigma*||h_t|| per position; eps must then exceed sigma
        from .robust import add_noise

        gen = torch.Generator().manual_seed(args.seed)
        prompts = [add_noise(s, args.noise, gen) for s in prompts]
        error += args.noise * 1.01
        print(f"added relative noise sigma={args.noise:g} (seed {args.seed}); eps = measured + {error:.3g}",
              file=sys.stderr)
    plain = getattr(tap, "plain_states", True)
    if args.policy in ("bruteforce", "hardprompts") and not plain:
        raise SipitError(f"--policy {args.policy} inverts states only, not a {st.surface} file")
    if args.engine != "local" and (args.policy in ("bruteforce", "hardprompts") or not plain):
        raise SipitError(f"--engine {args.engine} runs SipIt's policies on states files; "
                         f"this {st.surface} file with --policy {args.policy} runs locally")
    if args.policy == "hardprompts":  # the paper's PEZ baseline (invert/baselines.py)
        from .baselines import HardPromptsConfig

        if not args.quiet:
            import logging

            logging.basicConfig(level=logging.INFO, format="%(message)s")
        config = HardPromptsConfig(steps=args.steps, eps=args.eps, observation_error=error, certify=args.certify)
    else:
        config = InvertConfig(batch_size=args.batch_size, eps=args.eps, observation_error=error, certify=args.certify)
    if args.engine == "local":
        result = run(args.policy, lm, prompts, layer, config, final_norm=final_norm, progress=not args.quiet,
                     true_ids=st.ids, max_seconds=args.max_seconds, tap=tap)
    else:  # chunks of prompts on Ray workers, each chunk's result kept so a rerun continues
        config.policy, config.max_seconds = args.policy, args.max_seconds
        result = invert_batch(make_engine(args.engine, args.workers), lm, prompts, layer, config,
                              final_norm=final_norm, progress=not args.quiet, true_ids=st.ids,
                              parts_dir=out.with_suffix(".parts"))
    summary = dict(states=str(args.states), noise=args.noise, **result.summary())
    write_jsonl(out, [p.to_json() for p in result.prompts])
    summary_path = write_json(out.with_suffix(".summary.json"), summary)
    for i, p in enumerate(result.prompts):
        if p.status == "failed":
            k = next((j for j, q in enumerate(p.positions) if q.token is None or q.distance > result.eps), len(p.ids))
            verified = f"; the first {k} token(s) were verified: {lm.decode(p.ids[:k])!r}" if k else ""
            if len(p.ids) > k:  # an optimisation baseline's best sequence: not a recovery
                verified += f"; best sequence found, unverified: {p.text!r}"
            print(f"[{i}] FAILED: {p.message}{verified}")
        else:
            cls = "" if p.status == "ok" else f" (ambiguous: {p.message})"
            print(f"[{i}] recovered{cls}: {p.text!r}")
        if p.true_ids is not None:
            print(f"[{i}] original : {lm.decode(p.true_ids)!r}  -> {'exact' if p.exact else 'NOT exact'}")
    s = summary
    print(f"{s['ok'] + s['ambiguous']}/{s['prompts']} prompts recovered ({s['failed']} failed) at layer {layer} of "
          f"{model}, policy {result.policy}, eps={result.eps:.3g}; {s['seconds_per_prompt_median']}s per prompt "
          f"(+{s['calibration_seconds']}s one-time calibration), {s['vocab_explored_pct']}% of the vocabulary "
          f"per position -> {out}, {summary_path}")
    return 1 if s["failed"] else 0



def add_invert_parser(sub) -> None:
    """Register `sipit invert` on the CLI's subparsers."""
    from ..engines import add_engine_options
    from ..models import PRECISIONS

    s = sub.add_parser("invert", help="recover the exact prompts from a states file")
    s.add_argument("states", help=".safetensors from `sipit capture` (any surface), a transformers hidden_states tuple, "
                                  "TransformerLens cache, nnsight save or vLLM export (.npy/.pt/.safetensors)")
    s.add_argument("--file-layers", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   help="vLLM exports: the layer ids the file holds, in order (eagle_aux_hidden_state_layer_ids)")
    s.add_argument("--model", default=None, help="default: the file's metadata")
    s.add_argument("--layer", type=int, default=None, help="default: the file's metadata")
    s.add_argument("--final-norm", default=None, action=argparse.BooleanOptionalAction,
                   help="states are after the final norm (default: the file's metadata, else no)")
    s.add_argument("--policy", default="learned",
                   choices=["learned", "gradient", "random", "exhaustive", "bruteforce", "hardprompts"],
                   help="candidate ordering (default learned: calibrated once per model and layer, then cached); "
                        "bruteforce and hardprompts are the paper's baselines")
    s.add_argument("--batch-size", type=int, default=256, help="candidates per forward pass")
    s.add_argument("--max-seconds", type=float, default=None,
                   help="wall-clock cap per prompt (a capped prompt is reported failed with what it finished)")
    s.add_argument("--steps", type=int, default=None,
                   help="hardprompts: optimisation steps per prompt (default: the paper's T*|V|/4, see --max-seconds)")
    s.add_argument("--eps", type=float, default=None,
                   help="relative acceptance threshold (default: measured recomputation noise x 50, x 4 for bf16/fp16 models, + dtype "
                        "rounding + the file's own storage rounding or --noise)")
    s.add_argument("--certify", default="none", metavar="none|top:K|full",
                   help="after recovery also evaluate the policy's top K others (top:K) or every token (full) at "
                        "every position, to certify it; near-duplicate tokens are always checked (default none)")
    s.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="model precision (default: the file's metadata, else fp32)")
    s.add_argument("-o", "--output", default=None, help="results JSONL (default STATES.results.jsonl); "
                                                       "the summary goes next to it as .summary.json")
    s.add_argument("--noise", type=float, default=None,
                   help="add relative Gaussian noise of norm SIGMA*||h_t|| per position first (eps default: measured + 1.01*SIGMA)")
    s.add_argument("--seed", type=int, default=0, help="noise seed")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_engine_options(s)
    s.set_defaults(fn=cmd_invert)
