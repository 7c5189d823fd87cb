"""Where a sweep's independent tasks run: in this process (`local`) or on a Ray cluster (`ray`).

A sweep (states of prompt batches, the pairwise search over row panels, inversion of prompt
chunks of one or many files, an audit's cells) is a list of tasks `fn(shared, item)` whose results
the caller writes to its resumable run directory as they arrive. Both engines run the same tasks,
so they give the same results; the Ray engine only runs them elsewhere, several at a time, and
reruns a task whose worker died.

    engine = make_engine("ray")                  # a local Ray (`ray.init(num_cpus=...)`)
    engine = make_engine("ray:10.0.0.1:6379")    # an existing cluster (sipit installed on it)
    for k, out in engine.map(fn, items, shared): ...   # results in completion order

Models travel as a `ModelRef` (spec, precision, device, fingerprint): a worker loads the model
once per process (`worker_model`) and refuses one whose weights differ from the driver's.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from tqdm import tqdm

from .io import SipitError, atomic_write, write_json

RAY_INSTALL = "pip install 'sipit[ray]' (or: pip install ray)"
TASK_RETRIES = 3  # reruns of a task whose worker process died (Ray's default for tasks)


@dataclass(frozen=True)
class ModelRef:
    """What a worker needs to load the driver's model, and the fingerprint that proves it did."""

    spec: str
    precision: str
    device: str
    fingerprint: str
    max_layer: int | None = None  # the driver loaded blocks 1..max_layer only (load_model(max_layer=))

    @classmethod
    def of(cls, lm) -> "ModelRef":
        ref = cls(lm.name, lm.precision, str(lm.device), lm.fingerprint,
                  lm.n_layers if lm.n_layers < lm.depth else None)
        _MODELS[ref] = lm  # the driver's own tasks (local engine) use the loaded model
        return ref


_MODELS: dict[ModelRef, Any] = {}  # per process: a worker loads each model once


def worker_model(ref: ModelRef):
    """The model `ref` names, loaded once per process; SipitError if its weights differ."""
    if ref not in _MODELS:
        from .models import load_model

        lm = load_model(ref.spec, precision=ref.precision, device=ref.device, max_layer=ref.max_layer)
        if lm.fingerprint != ref.fingerprint:
            raise SipitError(f"a worker loaded {ref.spec!r} with fingerprint {lm.fingerprint}, the driver's "
                             f"is {ref.fingerprint}: install the same weights on every node")
        _MODELS[ref] = lm
    return _MODELS[ref]


class LocalEngine:
    """Every task in this process, in order."""

    name = "local"

    def map(self, fn: Callable, items: Iterable, shared=None, gpu: bool = False) -> Iterator[tuple[int, Any]]:
        """(index, fn(shared, item)) for every item; gpu: the tasks want a GPU (Ray engine only)."""
        for k, item in enumerate(items):
            yield k, fn(shared, item)


def _run_task(fn, threads, shared, item):
    """A task as a Ray worker runs it: `threads` torch threads (Ray sets 1 thread per CPU)."""
    torch.set_num_threads(threads)
    return fn(shared, item)


class RayEngine:
    """Tasks as Ray tasks: `shared` goes to the object store once, a task whose worker dies is rerun
    (up to TASK_RETRIES times), results come back as they finish.

    address: None = start a local Ray with `num_cpus` CPUs (default: all); else a cluster address.
    num_gpus: GPUs per task (default: 1 for tasks that want one (map's gpu) when the cluster has GPUs).
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, num_gpus: float | None = None,
                 threads: int = 1):
        self.ray = import_ray()
        self.address, self.num_cpus, self.num_gpus, self.threads = address, num_cpus, num_gpus, threads

    def start(self):
        ray = self.ray
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False)
        return ray

    def workers(self) -> int:
        return int(self.start().cluster_resources().get("CPU", 1))

    def map(self, fn: Callable, items: Iterable, shared=None, gpu: bool = False) -> Iterator[tuple[int, Any]]:
        ray = self.start()
        gpus = self.num_gpus
        if gpus is None:  # one GPU per task when the tasks want one and the cluster has GPUs
            gpus = 1 if gpu and ray.cluster_resources().get("GPU", 0) >= 1 else 0
        task = ray.remote(_run_task).options(num_cpus=1, num_gpus=gpus, max_retries=TASK_RETRIES)
        ref = ray.put(shared)
        pending = {task.remote(fn, self.threads, ref, item): k for k, item in enumerate(items)}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                k = pending.pop(done[0])
                try:
                    out = ray.get(done[0])
                except ray.exceptions.RayTaskError as e:  # a task's own error: bad input says so in one line
                    if isinstance(e.cause, SipitError):
                        raise e.cause from None
                    raise
                yield k, out
        finally:  # interrupted or failed: nothing keeps running for a driver that is gone
            for r in pending:
                ray.cancel(r)


def _invert_chunk(specs: list[dict], item: tuple[int, list, list | None]):
    """An engine task: sipit.invert.invert on a chunk of one job's prompts ([T_i, d] states, true ids)."""
    from .invert import invert

    j, states, true_ids = item
    spec = specs[j]
    return invert(worker_model(spec["model"]), states, spec["layer"], spec["config"], final_norm=spec["final_norm"],
                  progress=False, true_ids=true_ids)


@dataclass
class InvertJob:
    """Prompts of one model and layer to invert (sipit.invert.invert's arguments); parts_dir: where
    each finished chunk is kept (None: nowhere), so that a rerun after a crash continues."""

    lm: Any
    states: list  # [T_i, d] per prompt
    layer: int
    config: Any = None
    final_norm: bool = False
    true_ids: list | None = None
    parts_dir: Path | None = None


def invert_jobs(engine, jobs: list[InvertJob], chunk: int = 8, progress: bool = True) -> Iterator[tuple[int, Any]]:
    """(index, InversionResult) of each job as soon as its last chunk is in. The chunks (`chunk`
    prompts) of all jobs are one list of engine tasks, so many small jobs keep every worker busy;
    a job's prompts keep their order. A chunk found in its job's parts_dir is not run again."""
    specs, items, paths, spans = [], [], [], []  # spans[j]: job j's item indices
    for j, job in enumerate(jobs):
        states = list(job.states)
        specs.append(dict(model=ModelRef.of(job.lm), layer=job.layer, config=job.config, final_norm=job.final_norm))
        chunks = [(j, states[s : s + chunk], job.true_ids[s : s + chunk] if job.true_ids is not None else None)
                  for s in range(0, len(states), chunk)]
        if job.parts_dir is not None:
            _claim_parts(Path(job.parts_dir), specs[j], chunks)
        spans.append(range(len(items), len(items) + len(chunks)))
        items += chunks
        paths += [Path(job.parts_dir) / f"chunk_{c:05d}.pkl" if job.parts_dir else None for c in range(len(chunks))]
    done = {k: pickle.loads(p.read_bytes()) for k, p in enumerate(paths) if p is not None and p.exists()}
    todo = [k for k in range(len(items)) if k not in done]
    n_prompts = lambda ks: sum(len(items[k][1]) for k in ks)  # noqa: E731
    bar = tqdm(total=n_prompts(range(len(items))), initial=n_prompts(done), disable=not progress,
               desc=f"sipit ({engine.name})", unit="prompt")
    finished = set()

    def complete():  # the jobs whose every chunk is in, merged, each once
        for j, span in enumerate(spans):
            if j not in finished and all(k in done for k in span):
                finished.add(j)
                parts = [done[k] for k in span]
                yield j, replace(parts[0], prompts=[q for r in parts for q in r.prompts],
                                 seconds=sum(r.seconds for r in parts),
                                 calibration_seconds=max(r.calibration_seconds for r in parts))

    yield from complete()
    gpu = any(s["model"].device.startswith("cuda") for s in specs)
    for t, res in engine.map(_invert_chunk, [items[k] for k in todo], specs, gpu=gpu):
        k = todo[t]
        if paths[k] is not None:
            atomic_write(paths[k], pickle.dumps(res))
        done[k] = res
        bar.update(len(res.prompts))
        yield from complete()
    bar.close()


def invert_batch(engine, lm, states: list[torch.Tensor], layer: int, config=None, *, final_norm: bool = False,
                 true_ids: list | None = None, chunk: int = 8, parts_dir: str | Path | None = None,
                 progress: bool = True):
    """sipit.invert.invert of many prompts, `chunk` prompts per engine task; same InversionResult.

    parts_dir: each finished chunk's result is saved there (pickle, atomically), so a rerun with the
    same inputs after a crash inverts only the missing chunks. Prompts keep their input order."""
    from .invert import invert

    if isinstance(engine, LocalEngine) and parts_dir is None:
        return invert(lm, states, layer, config, final_norm=final_norm, progress=progress, true_ids=true_ids)
    job = InvertJob(lm, list(states), layer, config, final_norm, true_ids, Path(parts_dir) if parts_dir else None)
    return next(invert_jobs(engine, [job], chunk, progress))[1]


def _claim_parts(parts_dir: Path, spec: dict, chunks: list) -> None:
    """Make parts_dir hold this job's chunks: refuse one made from other inputs (no stale results)."""
    h = hashlib.sha256(repr((spec["model"], spec["layer"], spec["config"], spec["final_norm"])).encode())
    for _, states, true_ids in chunks:
        for x in states:
            h.update(x.detach().float().cpu().contiguous().numpy().tobytes())
        h.update(repr(true_ids).encode() + b";")
    key, path = h.hexdigest()[:16], parts_dir / "key.txt"
    if path.exists() and path.read_text().strip() != key:
        raise SipitError(f"{parts_dir} holds the chunks of another inversion (other states, model, layer, "
                         "config or chunking): delete it or choose another --output")
    atomic_write(path, key + "\n")


def _audit_cell(job: dict, spec: tuple):
    """An engine task: one audit cell (sipit.audit.run.compute_cell) on the worker's model."""
    from .audit.run import compute_cell

    return compute_cell(worker_model(job["model"]), job["cfg"], job["inputs"], *spec)


def audit_cells(engine, lm, cfg, inputs, cells: list[tuple[Path, tuple]], progress: bool = True) -> None:
    """Each (path, spec) of `cells` computed by compute_cell(lm, cfg, inputs, *spec) as an engine
    task, its JSON written to path as it finishes (the audit's resume unit)."""
    job = dict(model=ModelRef.of(lm), cfg=cfg, inputs=inputs)
    bar = tqdm(total=len(cells), desc=f"audit cells ({engine.name})", unit="cell", disable=not progress or not cells)
    for k, out in engine.map(_audit_cell, [spec for _, spec in cells], job, gpu=str(lm.device).startswith("cuda")):
        write_json(cells[k][0], out)
        bar.update()
    bar.close()


def import_ray():
    try:
        import ray
    except ImportError:
        raise SipitError(f"--engine ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


def make_engine(spec: str = "local", workers: int | None = None):
    """'local' | 'ray' (a local Ray with `workers` CPUs) | 'ray:ADDRESS' (an existing cluster)."""
    name, _, address = (spec or "local").partition(":")
    if name == "local" and not address:
        return LocalEngine()
    if name == "ray":
        return RayEngine(address=address or None, num_cpus=workers)
    raise SipitError(f"unknown engine {spec!r}: use local, ray or ray:ADDRESS (e.g. ray:10.0.0.1:6379)")


def add_engine_options(parser) -> None:
    """`--engine` and `--workers` on a subcommand that runs a sweep."""
    parser.add_argument("--engine", default="local",
                        help="local (default, this process), ray (a local Ray) or ray:ADDRESS (a Ray cluster); "
                             f"ray needs {RAY_INSTALL}")
    parser.add_argument("--workers", type=int, default=None,
                        help="CPUs of the local Ray started by --engine ray (default: all)")
