"""`sipit identify`: which model, layer and final norm made each states file (identify.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from .io import SipitError


def identify_file(path: Path, model_names: list[str] | None, load, screens: dict, exhaustive: bool = False,
                  mask: str | None = None, precision: str | None = None) -> list[tuple[str, object]]:
    """(label, Identification) for each candidate model of one file (a vLLM export: for each of its layer slots,
    from its own token ids). model_names: the models to try (None: the file's own, else every installed
    embedded model as wide as the states); load(name, precision) -> LM; screens: Screens per model name, fitted on
    first use; exhaustive: identify's; mask: a padded batch's attention_mask file (load_states); precision: the
    candidates' (None: the file's, as `sipit invert` reads it: its metadata, else a bfloat16/float16 file's dtype,
    else fp32)."""
    from .identify import PROBE, Screens, identify_states, identify_with_ids
    from .readers import vllm_export
    from .states import computed_in, load_states, read_tensors

    tensors, meta = read_tensors(path)
    if "surface" not in meta and vllm_export(tensors):
        hs, ids = tensors["hidden_states"], tensors["token_ids"].tolist()
        at = precision or computed_in(hs) or "fp32"
        return [(f"slot {i}", identify_with_ids(lm, ids, hs[:, i]))
                for lm in _candidates(path, model_names, None, hs.shape[-1], lambda n: load(n, at))
                for i in range(hs.shape[1])]
    st = load_states(path, mask=mask)
    if st.surface != "states":
        raise SipitError(f"{path}: a {st.surface} file; `sipit identify` reads hidden states (its layer is the "
                         "file's: give it to `sipit invert` with --layer)")
    at = precision or st.precision or "fp32"
    out = []
    for lm in _candidates(path, model_names, st.model, st.d_model, lambda n: load(n, at)):
        if not st.ids and lm.name not in screens:
            print(f"sipit: fitting {lm.name}'s screens (one pass of {PROBE} tokens through every block)",
                  file=sys.stderr)
            screens[lm.name] = Screens.fit(lm)
            print(f"sipit: fitted in {screens[lm.name].seconds:.1f}s", file=sys.stderr)
        out.append(("", identify_states(lm, st, screens.get(lm.name), exhaustive)))
    return out


def _candidates(path: Path, names: list[str] | None, own: str | None, width: int, load) -> list:
    """The models to try, loaded (each once per run): `names`, else the file's own, else every installed embedded
    model `width` wide; of those, the ones whose residual stream is `width` wide."""
    from .models import installed_embedded

    names = names or ([own] if own else installed_embedded(width))
    if not names:
        raise SipitError(f"{path}: no installed embedded model is {width} wide, and the file names none: give --model")
    models = [load(n) for n in names]
    fitting = [lm for lm in models if lm.d_model == width]
    if not fitting:
        widths = ", ".join(f"{lm.name} {lm.d_model}" for lm in models)
        raise SipitError(f"{path}: states of width {width}; no candidate model is that wide ({widths}): give --model")
    return fitting


def describe(path: Path, label: str, ident, mask: str | None = None) -> str:
    """One result as lines a person reads, ending with the `sipit invert` command it implies (mask: the
    --attention-mask file it was read with)."""
    where = f"{path}{' ' + label if label else ''}"
    seen = "every position of the file's own ids" if ident.by_ids else \
        f"position 0 of {ident.hypotheses[0].matched}/{ident.prompts} prompt(s)"
    best = ident.best
    if best is None:
        near = ident.hypotheses[0]
        if ident.matching:
            return (f"{where}: {ident.model}: ambiguous, {', '.join(h.name for h in ident.matching)} all match "
                    f"within {ident.tolerance:.2g} (the file's rounding cannot tell them apart)")
        hint = "" if ident.exhaustive or ident.by_ids else "; --exhaustive checks every token"
        return (f"{where}: {ident.model}: no layer matches (nearest: {near.name}, scaled distance {near.distance:.2g} "
                f"> tolerance {ident.tolerance:.2g}): another model, not its residual stream, or a first token no "
                f"shortlist held{hint}")
    runner = ident.hypotheses[1]
    norm = " --final-norm" if best.final_norm else ""
    within = max(d for d in best.distances if d <= ident.tolerance)
    line = (f"{where}: {best.name} of {ident.model}: {seen} within {within:.2g} (tolerance "
            f"{ident.tolerance:.2g}; next: {runner.name}, {runner.distance:.2g}) [{ident.seconds:.1f}s]")
    if label:  # a vLLM slot: slots_command gives the file's line
        return line
    mask = f" --attention-mask {mask}" if mask else ""
    return line + f"\n  invert with: sipit invert {path}{mask} --model {ident.model} --layer {best.layer}{norm}"


def slots_command(path: Path, results: list[tuple[str, object]]) -> str | None:
    """For a vLLM export whose every slot one model identified: the `sipit invert` line with its --file-layers."""
    for model in dict.fromkeys(ident.model for _, ident in results):
        slots = [ident.best for _, ident in results if ident.model == model]
        if all(slots):
            layers = ",".join(str(h.layer) for h in slots)
            return (f"  invert with: sipit invert {path} --model {model} --file-layers {layers} "
                    f"--layer {slots[-1].layer}")
    return None


def cmd_identify(args):
    from .io import write_json
    from .models import load_model

    models, screens = {}, {}

    def load(name, precision):
        if (name, precision) not in models:
            print(f"sipit: loading {name}" + (f" in {precision}" if precision != "fp32" else ""), file=sys.stderr)
            models[name, precision] = load_model(name, precision=precision, device=args.device)
        return models[name, precision]

    rows, missed = [], []
    for path in map(Path, args.files):
        if not path.is_file():
            raise SipitError(f"states file not found: {path}")
        results = identify_file(path, args.model, load, screens, args.exhaustive, args.attention_mask, args.precision)
        for label, ident in results:
            print(describe(path, label, ident, args.attention_mask))
            rows.append(dict(file=str(path), slot=label or None, **ident.to_json()))
        if results and results[0][0] and (command := slots_command(path, results)):
            print(command)
        found = {}  # label -> identified by some candidate model (a vLLM export: every slot must be)
        for label, ident in results:
            found[label] = found.get(label, False) or ident.best is not None
        if not all(found.values()):
            missed.append(str(path))
    if args.json:
        write_json(args.json, rows)
    if missed:
        print(f"sipit: not identified: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


def add_identify_parser(sub) -> None:
    from .models import PRECISIONS

    s = sub.add_parser("identify", help="which model, layer and final norm made a states file (one without its "
                                        "layer: nnsight's, a raw dump, a vLLM export)")
    s.add_argument("files", nargs="+", help="states files (.safetensors, .pt, .npy)")
    s.add_argument("--model", action="append", default=None,
                   help="a candidate model (repeat for several; default: the file's own, else every installed "
                        "embedded model as wide as the states)")
    s.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="the candidates' precision (default: the file's, as sipit invert reads it: its metadata, "
                        "else a bfloat16 or float16 file's dtype, else fp32)")
    s.add_argument("--exhaustive", action="store_true",
                   help="where no shortlisted token matches, run every token through every block (SmolLM2: 145 s "
                        "on 2 CPU threads)")
    s.add_argument("--attention-mask", default=None, metavar="FILE",
                   help="a padded batch's attention_mask [B, T], where the states file does not hold it")
    s.add_argument("--json", help="also write every hypothesis' scores as JSON here")
    s.set_defaults(fn=cmd_identify)
