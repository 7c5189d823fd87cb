"""`sipit capture`: prompts (text, file, corpus or token ids) -> a file of what a surface leaks."""
from __future__ import annotations

import time
from pathlib import Path

from .io import SipitError


def _prompts(lm, args) -> list[list[int]]:
    if args.corpus is not None:
        from .corpora import sample

        return [p.ids for p in sample(args.corpus, lm.tokenizer, args.length, seed=args.seed, vocab_size=lm.vocab_size)]
    path = Path(args.ids or args.file or "")
    if args.text is None and not path.is_file():
        raise SipitError(f"prompt file not found: {path}")
    if args.ids is not None:
        return _read_ids(path, lm.vocab_size)
    texts = [args.text] if args.text is not None else [line for line in path.read_text().splitlines() if line.strip()]
    if not texts or not all(t.strip() for t in texts):
        raise SipitError("no prompt given: --text is empty or the file has no non-empty lines")
    return [lm.encode(t) for t in texts]


def _read_ids(path: Path, vocab_size: int) -> list[list[int]]:
    """One prompt per non-empty line: token ids separated by whitespace and/or commas."""
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.replace(",", " ").split()
        if not fields:
            continue
        if not all(f.isdigit() and int(f) < vocab_size for f in fields):
            raise SipitError(f"{path}:{n}: expected token ids 0..{vocab_size - 1} separated by spaces or commas, "
                             f"got {line.strip()[:80]!r}")
        prompts.append([int(f) for f in fields])
    if not prompts:
        raise SipitError(f"{path}: no id lists (one whitespace- or comma-separated list per line)")
    return prompts


def cmd_capture(args):
    from .capture import SurfaceSpec, capture_surface
    from .models import load_model
    from .states import save_surface

    spec = SurfaceSpec.parse(args.surface)
    lm = load_model(args.model, precision=args.precision, device=args.device)
    if args.layer is None and spec.kind == "sae":  # the layer the SAE's hook reads
        from .models.sae import sae_layer

        args.layer = sae_layer(spec.sae)
    if args.layer is None and spec.kind not in ("logits", "logprobs"):
        raise SipitError(f"--surface {args.surface} needs --layer")
    layer = lm.layer_index(-1 if spec.kind in ("logits", "logprobs") else args.layer)
    final_norm = spec.kind in ("logits", "logprobs") or args.final_norm
    ids = _prompts(lm, args)
    t = time.perf_counter()
    tensors, meta = capture_surface(lm, ids, spec, layer, final_norm, seed=args.seed)
    save_surface(args.output, tensors, [len(p) for p in ids], model=args.model, layer=layer, final_norm=final_norm,
                 tokenizer=lm.tokenizer_fingerprint, precision=lm.precision, surface=spec.kind, ids=ids,
                 storage=args.storage, extra_meta=meta)
    print(f"captured {args.surface} of {len(ids)} prompt(s), {sum(map(len, ids))} tokens, layer {layer} of {args.model} "
          f"({lm.precision}, final_norm={final_norm}, stored {args.storage}) in {time.perf_counter() - t:.2f}s "
          f"-> {args.output}")


def add_capture_parser(sub, add_model) -> None:
    """Register `sipit capture` (add_model: cli.add_model, the shared --model/--precision options)."""
    from .capture import SURFACES_HELP
    from .storage import STORAGE

    s = sub.add_parser("capture", help="capture what leaks of prompts at one layer: states, KV cache, logits, projections, "
                                           "SAE latents")
    add_model(s)
    s.add_argument("--layer", type=int, default=None, help="0 = embeddings, i = after block i (kv: block i's cache), "
                                                           "negative from the end (logits: the last, implied)")
    s.add_argument("--final-norm", action="store_true", help="apply the model's final norm to the state")
    s.add_argument("--surface", default="states", help=f"what leaks: {SURFACES_HELP} (default states)")
    s.add_argument("--storage", default="fp32", choices=STORAGE,
                   help="store the observations rounded to this format (int8: one scale per tensor, int8-row and "
                        "fp8: per row); default fp32")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="one prompt")
    src.add_argument("--file", help="text file, one prompt per line")
    src.add_argument("--corpus", help="corpus spec NAME:N,... as for `collisions` (e.g. prose:10,random:5)")
    src.add_argument("--ids", help="file of token ids: one whitespace- or comma-separated list per line")
    s.add_argument("--length", type=int, default=20, help="--corpus: tokens per prompt (default 20)")
    s.add_argument("--seed", type=int, default=0, help="--corpus sampling, projection and permutation seed")
    s.add_argument("-o", "--output", required=True, help="output .safetensors file")
    s.set_defaults(fn=cmd_capture)
