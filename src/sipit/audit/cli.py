"""`sipit audit`: the main CLI calls `add_audit_parser(subparsers)`; the handler runs audit.run."""
from __future__ import annotations

import argparse
from dataclasses import fields

from .run import DEFAULT_DEFENSES, AuditConfig
from .surfaces import SURFACES_HELP


def add_audit_parser(sub) -> None:
    from ..engines import add_engine_options

    d = AuditConfig()
    s = sub.add_parser("audit", help="does this leak the prompt, and what would stop it? (HTML report)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("--model", default=d.model, help="model spec (embedded name, .gguf, HF id/dir, tiny-llama)")
    s.add_argument("--layers", default=d.layers, help="'default' (1, L/2, L), 'all' or e.g. 1,8,15")
    s.add_argument("--surface", default=d.surface, help=f"what leaks: {SURFACES_HELP}")
    s.add_argument("--defenses", default=DEFAULT_DEFENSES,
                   help="applied to what leaks: none, noise:SIGMA (relative), quant:int8|int4|fp8, project:K (states "
                        "only); a bare value continues the previous family: noise:0.01,0.1")
    s.add_argument("--prompts", default=d.prompts, help="corpus spec NAME:N,... (see `sipit corpora`) or a .txt file")
    s.add_argument("--length", type=int, default=d.length, help="tokens per corpus prompt")
    s.add_argument("--policy", default=d.policy, help="SipIt policy: learned, exhaustive, random, gradient")
    s.add_argument("--candidates", type=int, default=d.candidates,
                   help="noise attack on vocabularies > 4096: policy top-k + k random per position (an upper "
                        "bound, not a certificate); 0 = every token (certified, slow)")
    s.add_argument("--max-candidates", type=int, default=d.max_candidates,
                   help="SipIt attacks (none, quant, project): tokens tried per position before the prompt counts as "
                        "not recovered; 0 = the whole vocabulary")
    s.add_argument("--trials", type=int, default=d.trials, help="noisy copies per prompt and sigma")
    s.add_argument("--geometry-prompts", type=int, default=d.geometry_prompts,
                   help="sampled prompts for the minimum collision distance")
    s.add_argument("--utility-text", default=d.utility_text, help="held-out corpus spec for the utility cost")
    s.add_argument("--seed", type=int, default=d.seed)
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    s.add_argument("-o", "--output", required=True, help="output directory (index.html, report.json, *.png)")
    add_engine_options(s)  # robustness and defence cells as Ray tasks; same report
    s.set_defaults(fn=cmd_audit)


def cmd_audit(args) -> int:
    from ..engines import make_engine
    from ..models import load_model
    from .run import resolve, run

    names = {f.name for f in fields(AuditConfig)}
    cfg = AuditConfig(**{k: v for k, v in vars(args).items() if k in names})
    cfg.candidates = cfg.candidates or None  # 0: every token
    cfg.max_candidates = cfg.max_candidates or None
    engine = make_engine(args.engine, args.workers)  # no Ray installed: one clear error before any work
    lm = load_model(cfg.model, device=args.device)
    resolve(lm, cfg)  # bad options fail before any work
    report = run(lm, cfg, args.output, progress=not args.quiet, engine=engine)
    for info in report["layers"].values():
        print(info["verdict"])
    print(f"{len(report['cells'])} cells, {report['seconds_this_run']}s -> {args.output}/index.html")
    return 0
