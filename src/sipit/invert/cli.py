"""`sipit invert FILE [FILE|DIR ...]`: recover the exact prompts from states (or other surface) files.

One file: every prompt printed, results in FILE.results.jsonl (or -o). Several files or a
directory: one line per file and a total; a file whose results are already there for the same
inputs and options is skipped, so a rerun after a crash continues."""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..io import SipitError


STATES_SUFFIXES = (".safetensors", ".npy", ".pt", ".pth")  # what a directory argument contributes


@dataclass(eq=False)
class FileJob:
    """One states file made ready to invert, and where its results go."""

    path: Path
    out: Path  # results JSONL; the summary is out.with_suffix(".summary.json")
    lm: object
    model: str
    layer: int
    final_norm: bool
    tap: object
    prompts: list  # observations [T_i, tap.dim] per prompt
    true_ids: list | None
    config: object
    key: str  # hash of the file's bytes and every option that changes its results
    padding: dict  # row -> leading positions that look like left padding (States.padding_runs), inverted after them

    @property
    def summary_path(self) -> Path:
        return self.out.with_suffix(".summary.json")

    @property
    def to_invert(self) -> list:
        """The prompts as inverted: each after what looks like its left padding."""
        return [p[self.padding.get(i, 0):] for i, p in enumerate(self.prompts)]


def prepare(args, path: Path, out: Path, models: dict) -> FileJob:
    """Read and validate one states file, load its model (once per model and precision: `models`, which also keeps
    the screens of a model that identified a missing layer)."""
    from ..capture import check_layer, open_surface
    from ..models import LayerTap, load_model
    from .config import InvertConfig, batch_size_for
    from .learned.config import calibration_config
    from ..states import load_states

    st = load_states(path, args.layer, args.file_layers, args.attention_mask)
    model = args.model or st.model
    layer = args.layer if args.layer is not None else st.layer
    if model is None:
        raise SipitError(f"{path} does not say which model made it: give --model (`sipit identify {path}` finds "
                         "the model and layer among the installed ones)")
    final_norm = st.final_norm if args.final_norm is None else args.final_norm
    precision = args.precision or st.precision or "fp32"
    if not args.precision and st.precision and "precision" not in st.meta:  # (states.computed_in)
        print(f"sipit: {path} does not say its model's precision; its states are {precision}, as those of a model "
              f"computing in {precision} are: {model} runs in {precision} (--precision fp32 if float32 states were "
              "only stored so)", file=sys.stderr)
    if (model, precision) not in models:
        models[model, precision] = load_model(model, precision=precision, device=args.device)
    lm = models[model, precision]
    if layer is None:  # (the screens it fits are kept beside the model, for the run's other files)
        layer, final_norm = identified_layer(path, lm, st, args.final_norm, models, (model, precision, "screens"))
    rotated_keys = st.surface == "kv" and st.part != "values"
    if st.left_padded and (rotated_keys or lm.left_padding_moves):
        what = "keys are rotated by" if rotated_keys else "states depend on"
        print(f"sipit: warning: {path} holds left-padded prompts, and {model}'s {what} a token's position counted "
              "from its row's start: those of a plain forward (no position_ids) place a prompt after its padding, "
              "where they are not its own and are not recovered; those of generate() or nnsight (position_ids = "
              "attention_mask.cumsum(-1) - 1) are", file=sys.stderr)
    if st.tokenizer and st.tokenizer != lm.tokenizer_fingerprint:
        print(f"sipit: warning: {path} was made with another tokenizer than {model}'s", file=sys.stderr)
    tap, prompts, error = open_surface(lm, st, lm.layer_index(layer), final_norm, sae=args.sae)
    padding = {i: k for i, k in enumerate(st.padding_runs()) if k}
    if padding:  # inverted after it (FileJob.to_invert); settle_padding inverts a row whole where it was not padding
        rows = ", ".join(f"{i} ({k})" for i, k in list(padding.items())[:5]) + (" ..." * (len(padding) > 5))
        print(f"sipit: {path}: rows {rows} open with that many identical states, as a left-padded batch's padding "
              "does (no attention_mask given): each inverted after them, and whole where the rest is not its tokens' "
              "alone", file=sys.stderr)
    if st.ids and type(tap) is LayerTap:  # plain states with their ids: a wrong layer is told in seconds
        check_layer(lm, st.ids[0], prompts[0], tap.layer, final_norm, error)
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
        if args.batch_prompts < 1:
            raise SipitError(f"--batch-prompts must be at least 1, got {args.batch_prompts}")
        config = InvertConfig(batch_size=batch_size_for(args, lm.device), eps=args.eps, observation_error=error,
                              certify=args.certify, learned=calibration_config(args.calibration),
                              batch_prompts=args.batch_prompts, draft=args.draft)
    with open(path, "rb") as f:
        key = hashlib.file_digest(f, "sha256")
    if args.attention_mask:
        with open(args.attention_mask, "rb") as f:
            key.update(hashlib.file_digest(f, "sha256").digest())
    key.update(repr((lm.fingerprint, tap.key, args.policy, config, args.noise, args.seed, args.max_seconds)).encode())
    return FileJob(path, out, lm, model, layer, final_norm, tap, prompts, st.ids, config, key.hexdigest()[:16],
                   padding)


def identified_layer(path: Path, lm, st, final_norm: bool | None, cache: dict, key) -> tuple[int, bool]:
    """The layer (and final norm, unless given) of a states file that does not say, identified from its first
    positions (identify.py; the model's Screens kept in cache[key]); one clear SipitError where none or several
    match."""
    from ..identify import Screens, identify_states

    if st.surface != "states":
        raise SipitError(f"{path} does not say which layer made it: give --layer")
    print(f"sipit: {path} does not say which layer made it: identifying it", file=sys.stderr)
    if not st.ids and key not in cache:
        cache[key] = Screens.fit(lm)
    ident = identify_states(lm, st, cache.get(key))
    best = ident.best
    if best is None or (final_norm is not None and best.final_norm != final_norm):
        seen = ", ".join(h.name for h in ident.matching) or f"none within {ident.tolerance:.2g}"
        raise SipitError(f"{path}: its layer could not be identified among {lm.name}'s (matching: {seen}): "
                         "give --layer")
    print(f"sipit: {path}: {best.name} of {lm.name} ({best.matched}/{ident.prompts} first positions within "
          f"{ident.tolerance:.2g}, {ident.seconds:.1f}s)", file=sys.stderr)
    return best.layer, best.final_norm


def calibrate_jobs(jobs: list[FileJob]) -> dict:
    """The learned policy's missing calibrations of every job's tap, fitted in one shared pass per model
    and learned settings. -> {(id(lm), tap key): seconds its fit took now}"""
    from .learned.config import learned_config
    from .learned.fit import calibrate_cached_taps

    groups = {}  # (model, the jobs' learned settings) -> jobs: fitted with the settings they invert with
    for job in jobs:
        groups.setdefault((id(job.lm), learned_config(job.config)), []).append(job)
    fitted = {}
    for (model, config), group in groups.items():
        seconds = calibrate_cached_taps(group[0].lm, [job.tap for job in group], config)
        fitted.update({(model, key): s for key, s in seconds.items()})
    return fitted


def invert_files(engine, jobs: list[FileJob], args):
    """(job, InversionResult) for every job: in turn here (local), or all their prompt chunks as
    engine tasks, each file's chunks kept in OUT.parts so a rerun continues (ray)."""
    from ..engines import InvertJob, invert_jobs
    from . import run

    fitted = calibrate_jobs(jobs) if args.policy == "learned" else {}

    def with_calibration(job, result):  # the job's share of the shared calibration pass (and its padding settled)
        result = settle_padding(job, result, args)
        return job, replace(result, calibration_seconds=result.calibration_seconds + fitted.get((id(job.lm), job.tap.key), 0.0))

    if engine.name == "local":
        for job in jobs:
            yield with_calibration(job, run(args.policy, job.lm, job.to_invert, job.layer, job.config,
                                            final_norm=job.final_norm, progress=not args.quiet, true_ids=job.true_ids,
                                            max_seconds=args.max_seconds, tap=job.tap))
        return
    tasks = [InvertJob(job.lm, job.to_invert, job.layer, replace(job.config, policy=args.policy,
                                                               max_seconds=args.max_seconds),
                       job.final_norm, job.true_ids, job.out.with_suffix(".parts")) for job in jobs]
    for k, result in invert_jobs(engine, tasks, progress=not args.quiet):
        yield with_calibration(jobs[k], result)


def settle_padding(job: FileJob, result, args):
    """The rows inverted after what looked like left padding (job.padding): where the rest was recovered, its states
    are its tokens' alone, so nothing in it attended to the skipped positions: padding (PromptResult.left_padding). Where
    the rest failed at its first position it was not, and the row is inverted whole, here. -> the result"""
    from . import run

    redo = [i for i in job.padding if result.prompts[i].status == "failed"
            and (not result.prompts[i].positions or result.prompts[i].positions[0].token is None)]
    for i, k in job.padding.items():
        result.prompts[i].left_padding = 0 if i in redo else k
    if not redo:
        return result
    whole = run(args.policy, job.lm, [job.prompts[i] for i in redo], job.layer, job.config,
                final_norm=job.final_norm, progress=False, max_seconds=args.max_seconds, tap=job.tap)
    for i, p in zip(redo, whole.prompts):
        result.prompts[i] = p
    return replace(result, seconds=result.seconds + whole.seconds)


def write_results(job: FileJob, result, noise: float | None) -> dict:
    """The file's results JSONL and summary JSON (with the key that a rerun checks). -> summary"""
    from ..io import write_json, write_jsonl

    summary = dict(states=str(job.path), noise=noise, key=job.key, **result.summary())
    write_jsonl(job.out, [p.to_json() for p in result.prompts])
    write_json(job.summary_path, summary)
    return summary


def done_before(job: FileJob) -> dict | None:
    """The summary of a finished earlier run of this very job (same key, results written), else None."""
    from ..io import read_json

    if not (job.out.exists() and job.summary_path.exists()):
        return None
    summary = read_json(job.summary_path)
    return summary if summary.get("key") == job.key else None


def states_files(paths: list[str]) -> list[Path]:
    """The files named, a directory standing for its states files (sorted)."""
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.suffix in STATES_SUFFIXES)
            if not found:
                raise SipitError(f"{p} holds no states files ({', '.join(STATES_SUFFIXES)})")
            files += found
        else:
            files.append(p)
    return files


def results_paths(files: list[Path], output: str | None) -> list[Path]:
    """FILE.results.jsonl next to each file, or in the directory `output`; two files may not share one."""
    outs = [(Path(output) if output else f.parent) / f.with_suffix(".results.jsonl").name for f in files]
    seen = {}
    for f, o in zip(files, outs):
        if o in seen:
            raise SipitError(f"{seen[o]} and {f} would both write {o}: rename one or invert them separately")
        seen[o] = f
    return outs


def cmd_invert(args):
    from ..engines import make_engine

    engine = make_engine(args.engine, args.workers)  # no Ray installed: one clear error before any work
    if len(args.states) == 1 and not Path(args.states[0]).is_dir():
        path = Path(args.states[0])
        job = prepare(args, path, Path(args.output or path.with_suffix(".results.jsonl")), {})
        (job, result), = invert_files(engine, [job], args)
        return print_file(job, result, write_results(job, result, args.noise))
    files = states_files(args.states)
    models = {}
    jobs = [prepare(args, f, o, models) for f, o in zip(files, results_paths(files, args.output))]  # all valid first
    summaries = {job.path: done_before(job) for job in jobs}
    skipped = [job for job in jobs if summaries[job.path] is not None]
    for job in skipped:
        print(file_line(job, summaries[job.path], "done before, skipped"))
    t0, inverted, task_seconds = time.perf_counter(), 0, 0.0
    for job, result in invert_files(engine, [j for j in jobs if j not in skipped], args):
        summaries[job.path] = write_results(job, result, args.noise)
        inverted, task_seconds = inverted + len(result.prompts), task_seconds + result.seconds
        print(file_line(job, summaries[job.path]))
    wall = time.perf_counter() - t0
    S = list(summaries.values())
    total = {k: sum(s[k] for s in S) for k in ("prompts", "ok", "ambiguous", "failed")}
    print(f"{len(S)} files ({len(skipped)} done before): {total['ok'] + total['ambiguous']}/{total['prompts']} "
          f"prompts recovered ({total['failed']} failed); this run inverted {inverted} prompts in {wall:.1f}s "
          f"({inverted / max(wall, 1e-9):.3g} prompts/s on {args.engine}; tasks' own seconds summed: "
          f"{task_seconds:.1f}s)")
    return 1 if total["failed"] else 0


def file_line(job: FileJob, s: dict, note: str = "") -> str:
    """One file's summary line in a run of many."""
    return (f"{job.path}: {s['ok'] + s['ambiguous']}/{s['prompts']} recovered ({s['failed']} failed), layer "
            f"{job.layer} of {job.model}, {s['seconds_total']}s{f' ({note})' if note else ''} -> {job.out}")


def print_file(job: FileJob, result, s: dict) -> int:
    """A single file's report: every prompt, then its summary line. -> exit code"""
    lm = job.lm
    for i, p in enumerate(result.prompts):
        if p.status == "failed":
            k = next((j for j, q in enumerate(p.positions) if q.token is None or q.distance > result.eps), len(p.ids))
            verified = f"; the first {k} token(s) were verified: {lm.decode(p.ids[:k])!r}" if k else ""
            if len(p.ids) > k:  # an optimisation baseline's best sequence: not a recovery
                verified += f"; best sequence found, unverified: {p.text!r}"
            print(f"[{i}] FAILED: {p.message}{verified}")
        else:
            cls = "" if p.status == "ok" else f" (ambiguous: {p.message})"
            pads = ([f"after {p.left_padding} positions of left padding"] if p.left_padding else []) + (
                [f"before {p.right_padding} positions of right padding"] if p.right_padding else [])
            print(f"[{i}] recovered{cls}{''.join(' ' + x for x in pads)}: {p.text!r}")
        if p.true_ids is not None:
            print(f"[{i}] original : {lm.decode(p.true_ids)!r}  -> {'exact' if p.exact else 'NOT exact'}")
    # (the median alone hides a heavy tail: one random-id prompt at a deep layer can take most of a file's time)
    once = (f"+{s['calibration_seconds']}s one-time calibration, "
            f"+{(result.tolerance or {}).get('seconds', 0.0)}s measuring eps")
    print(f"{s['ok'] + s['ambiguous']}/{s['prompts']} prompts recovered ({s['failed']} failed) at layer {job.layer} of "
          f"{job.model}, policy {result.policy}, eps={result.eps:.3g}; {s['seconds_per_prompt_median']}s per prompt "
          f"(median; {s['seconds_total']}s in all, {once}), {s['vocab_explored_pct']}% of the vocabulary "
          f"per position -> {job.out}, {job.summary_path}")
    return 1 if s["failed"] else 0


def add_invert_parser(sub) -> None:
    """Register `sipit invert` on the CLI's subparsers."""
    from ..engines import add_engine_options
    from ..models import PRECISIONS
    from .learned.cli import add_calibration_option

    s = sub.add_parser("invert", help="recover the exact prompts from states files")
    s.add_argument("states", nargs="+",
                   help=".safetensors from `sipit capture` (any surface), a transformers hidden_states tuple, "
                        "TransformerLens cache, nnsight save or vLLM export (.npy/.pt/.safetensors); several files "
                        "or a directory (its .safetensors/.npy/.pt files): each inverted with its own model and "
                        "layer (from its metadata, or --model/--layer for all), each model loaded once; files "
                        "whose results exist for the same inputs are skipped")
    s.add_argument("--file-layers", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   help="vLLM exports: the layer ids the file holds, in order (eagle_aux_hidden_state_layer_ids)")
    s.add_argument("--attention-mask", default=None, metavar="FILE",
                   help="a padded batch's attention_mask [B, T] (.pt/.npy/.safetensors), where the states file does "
                        "not hold it: each row's prompt is where it is 1 (left or right padding)")
    s.add_argument("--model", default=None, help="default: the file's metadata")
    s.add_argument("--layer", type=int, default=None, help="default: the file's metadata")
    s.add_argument("--sae", default=None, metavar="DIR",
                   help="an SAE latents file's SAE (a SAELens or sparsify directory; default: the file's metadata)")
    s.add_argument("--final-norm", default=None, action=argparse.BooleanOptionalAction,
                   help="states are after the final norm (default: the file's metadata, else no)")
    s.add_argument("--policy", default="learned",
                   choices=["learned", "gradient", "random", "exhaustive", "bruteforce", "hardprompts"],
                   help="candidate ordering (default learned: calibrated once per model and layer, then cached); "
                        "bruteforce and hardprompts are the paper's baselines")
    add_calibration_option(s)
    s.add_argument("--batch-size", type=int, default=None,
                   help="candidates per forward pass when searching a position (default 256 on a CPU, 4096 on a GPU)")
    s.add_argument("--batch-prompts", type=int, default=32,
                   help="prompts in flight together in lock-step, one forward pass serving them all; as one finishes "
                        "the next starts (1: one at a time)")
    s.add_argument("--draft", action="store_true",
                   help="screen a deep search's wide batches with a bfloat16 copy of a float32 model, verifying only "
                        "the candidates it finds near (the rest last, if nothing matched): random ids at deep layers "
                        "a fifth faster on average, a few prompts much slower (default off)")
    s.add_argument("--max-seconds", type=float, default=None,
                   help="cap on each prompt's seconds (in a lock-step batch: its share of the shared passes plus its "
                        "own work); a capped prompt is reported failed with what it finished")
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
    s.add_argument("-o", "--output", default=None,
                   help="one file: the results JSONL (default STATES.results.jsonl), the summary next to it as "
                        ".summary.json; several files or a directory: the directory that gets every "
                        "STATES.results.jsonl (default: next to each file)")
    s.add_argument("--noise", type=float, default=None,
                   help="add relative Gaussian noise of norm SIGMA*||h_t|| per position first (eps default: measured + 1.01*SIGMA)")
    s.add_argument("--seed", type=int, default=0, help="noise seed")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_engine_options(s)
    s.set_defaults(fn=cmd_invert)
