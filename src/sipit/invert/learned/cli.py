"""`sipit calibrate`: fit (or find cached) the learned policy's calibrations of many layers in one pass; `sipit cache`:
what the cache holds, and pruning the calibrations this version no longer reads and the dequantized models whose
GGUF file changed."""
from __future__ import annotations

import json
import time


def add_calibration_option(parser, default: str = "full") -> None:
    from .config import CALIBRATIONS

    parser.add_argument("--calibration", default=default, choices=CALIBRATIONS,
                        help="learned policy: full (every token's position-0 state, certified bounds there) "
                             "or fast (a sample of 4,096 of them and 16k tokens of text, no lens: minutes less at deep "
                             "layers and big vocabularies, a weaker ranker, still exact); each cached on its own "
                             f"(default {default})")


def add_calibrate_parser(sub, add_model) -> None:
    s = sub.add_parser("calibrate", help="calibrate the learned policy at many layers in one pass (cached; "
                                         "later inversions at those layers start at once)")
    add_model(s)
    s.add_argument("--layers", default="all", help="'all' (default) or a list like 1,15,30 (negative from the end)")
    s.add_argument("--final-norm", action="store_true", help="for states captured with the final norm applied")
    s.add_argument("--tokens", type=int, help="calibration tokens (default: the learned policy's default)")
    add_calibration_option(s)
    s.set_defaults(fn=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from ...collisions.common import parse_layers
    from ...io import SipitError
    from ...models import load_model
    from .config import calibration_config
    from .fit import calibrate_cached_layers

    if args.tokens is not None and args.tokens < 256:
        raise SipitError(f"--tokens {args.tokens}: need at least 256 calibration tokens")
    config = calibration_config(args.calibration, args.tokens)
    lm = load_model(args.model, precision=args.precision, device=args.device)
    layers = parse_layers(args.layers, lm)
    t0 = time.perf_counter()
    seconds = calibrate_cached_layers(lm, layers, config, final_norm=args.final_norm)
    print(json.dumps(dict(model=lm.name, fingerprint=lm.fingerprint, layers=layers, final_norm=args.final_norm,
                          calibration=args.calibration, calibration_tokens=config.calibration_tokens,
                          table_tokens=config.table_tokens, seconds=round(time.perf_counter() - t0, 1),
                          fitted=[layer for layer, s in seconds.items() if s > 0],
                          seconds_per_layer={layer: round(s, 2) for layer, s in seconds.items() if s > 0})))
    return 0


def add_cache_parser(sub) -> None:
    s = sub.add_parser("cache", help="what sipit's cache holds (calibrations, dequantized models, ...); --prune "
                                     "deletes what no sipit of this version reads")
    s.add_argument("--prune", action="store_true", help="delete calibrations of older sipit versions, unreadable "
                                                        "ones and temporary files of killed saves, and dequantized "
                                                        "models whose GGUF file is gone or changed, or that no "
                                                        "load of this version used (made again when next loaded)")
    s.set_defaults(fn=cmd_cache)


def cmd_cache(args) -> int:
    import shutil

    from ...models.load import cache_dir, stale_dequantized
    from .cache import stale_files

    root = cache_dir()

    def size(paths) -> dict:
        files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
        return dict(files=len(files), gb=round(sum(f.stat().st_size for f in files) / 1e9, 3))

    kinds = {p.name: size([p]) for p in sorted(root.iterdir()) if p.is_dir()} if root.is_dir() else {}
    stale = stale_files() if root.is_dir() else []
    models = stale_dequantized()
    out = dict(cache=str(root), kinds=kinds, stale_calibrations=size(stale),
               stale_dequantized=dict(size(models), models=len(models)), pruned=False)
    if args.prune:
        for path in stale:
            path.unlink(missing_ok=True)
        for folder in models:
            shutil.rmtree(folder, ignore_errors=True)
        out["pruned"] = True
    print(json.dumps(out))
    return 0
