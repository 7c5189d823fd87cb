"""The local and Ray engines give identical results; a worker killed mid-run loses and duplicates nothing."""
import json
import math
import os
import signal
import sys

import pytest
import ray
import torch

from sipit import engines
from sipit.collisions import append_all, common, pairwise, sampled
from sipit.engines import LocalEngine, RayEngine, invert_batch, make_engine
from sipit.invert import InvertConfig
from sipit.io import SipitError, read_json
from sipit.models import LayerTap, load_model

CFG = sampled.SampledConfig(corpus="random:40", length=5, layers="0,1,-1", batch_size=8, keep=5)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # KillOnce travels to the workers


def stable(result: dict) -> dict:
    """A results.json (report.json, ...) without timings, threads and load."""
    if isinstance(result, dict):
        return {k: stable(v) for k, v in result.items() if "seconds" not in k and k not in ("load", "threads")}
    return [stable(v) for v in result] if isinstance(result, list) else result


def same(a, b) -> bool:
    """Equal, floats to float32 recomputation noise: a chunk's prompts share other passes than the whole
    file's (lock-step, passes padded or flat by their cost), so a verified distance of ~1e-7 may read 8e-8."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


class KillOnce:
    """A task wrapper: the first task to finish anywhere SIGKILLs its own worker process before
    returning (marker file: once per test), so Ray must rerun that task on a fresh worker."""

    def __init__(self, fn, marker):
        self.fn, self.marker = fn, str(marker)

    def __call__(self, shared, item):
        out = self.fn(shared, item)
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return out
        os.kill(os.getpid(), signal.SIGKILL)


class KillingRay(RayEngine):
    def __init__(self, marker):
        super().__init__(num_cpus=2)
        self.marker = marker

    def map(self, fn, items, shared=None, gpu=False):
        return super().map(KillOnce(fn, self.marker), items, shared, gpu)


@pytest.fixture(scope="module")
def ray_engine():
    engine = RayEngine(num_cpus=2)
    engine.start()
    yield engine
    ray.shutdown()


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def local_run(lm, tmp_path_factory, monkeypatch_module):
    out = tmp_path_factory.mktemp("local")
    return sampled.run(lm, CFG, out, progress=False, engine=LocalEngine())


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        m.setattr(pairwise, "PANEL_PAIRS", 97)  # several panels per layer: the reduction is exercised
        yield m


def test_make_engine():
    assert isinstance(make_engine("local"), LocalEngine)
    e = make_engine("ray:10.1.2.3:6379")
    assert isinstance(e, RayEngine) and e.address == "10.1.2.3:6379"
    with pytest.raises(SipitError, match="unknown engine"):
        make_engine("dask")


def test_without_ray_one_clear_error(monkeypatch, tmp_path, capsys):
    from sipit.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(SipitError, match=r"pip install 'sipit\[ray\]'"):
        make_engine("ray")
    for command in (["invert", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")],
                    ["audit", "--model", "tiny-llama", "-o", str(tmp_path / "audit")]):
        assert main([*command, "--engine", "ray"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pip install 'sipit[ray]'" in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_panels_cover_every_pair_once():
    for n in (2, 3, 50, 1001):
        for per in (1, 97, 10**9):
            bounds = pairwise.panels(n, per)
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a < b for a, b in bounds) and all(p[1] == q[0] for p, q in zip(bounds, bounds[1:]))
            if per == 97 and n == 1001:
                sizes = [sum(n - 1 - i for i in range(a, b)) for a, b in bounds]
                assert max(sizes) < 2 * 97 + n  # balanced: about `per` pairs each


def test_collisions_ray_equals_local(lm, local_run, ray_engine, tmp_path, monkeypatch_module):
    res = sampled.run(lm, CFG, tmp_path, progress=False, engine=ray_engine)
    want = local_run.to_dict()
    assert stable(res.to_dict()) == stable(want)
    assert [r["min_distance"] for r in res.layers] == [r["min_distance"] for r in want["series"][0]["layers"]]
    assert len(pairwise.panels(40, 97)) > 3
    # and both equal the one-process search with a single panel (the reduction is exact)
    x = common.load_layer(sorted((tmp_path / "states").glob("*.safetensors")), 1)
    one = pairwise.min_pairwise(x, keep=5, panel_pairs=10**9)
    many = pairwise.min_pairwise(x, keep=5, engine=ray_engine)
    assert many.closest == one.closest and many.below_threshold == one.below_threshold


def test_worker_killed_mid_run(lm, local_run, tmp_path, monkeypatch, monkeypatch_module):
    saved = []
    real = common.save_chunk
    monkeypatch.setattr(common, "save_chunk", lambda path, *a: (saved.append(path), real(path, *a)))
    marker = tmp_path / "killed"
    res = sampled.run(lm, CFG, tmp_path / "run", progress=False, engine=KillingRay(marker))
    assert marker.exists()  # a worker really died
    assert stable(res.to_dict()) == stable(local_run.to_dict())
    chunks = sorted((tmp_path / "run" / "states").iterdir())
    assert len(saved) == len(set(saved)) == len(chunks) == 5  # each batch written once, none lost
    assert all(c.suffix == ".safetensors" for c in chunks)  # no temporary file left behind


def test_exhaustive_ray_equals_local(lm, ray_engine, tmp_path, monkeypatch):
    monkeypatch.setattr(pairwise, "PANEL_PAIRS", lm.vocab_size**2 // 6)  # 3 panels per layer
    cfg = append_all.ExhaustiveConfig(corpus="random:12", length=4, layers="1,-1", batch_size=64, keep=5)
    a = append_all.run(lm, cfg, tmp_path / "local", progress=False, engine=LocalEngine())
    b = append_all.run(lm, cfg, tmp_path / "ray", progress=False, engine=ray_engine)
    assert stable(a.to_dict()) == stable(b.to_dict())
    assert a.layers[0][0]["n"] == lm.vocab_size


def test_batch_inversion_ray_equals_local(lm, ray_engine, tmp_path):
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, lm.vocab_size, (n,), generator=g).tolist() for n in (3, 4, 5, 3, 6)]
    tap = LayerTap(lm, 2)
    states = [tap.states(torch.tensor(s)) for s in ids]
    config = InvertConfig(policy="random")
    want = invert_batch(LocalEngine(), lm, states, 2, config, true_ids=ids, progress=False)
    got = invert_batch(ray_engine, lm, states, 2, config, true_ids=ids, chunk=2, parts_dir=tmp_path / "parts",
                       progress=False)
    assert [p.ids for p in got.prompts] == [p.ids for p in want.prompts] == ids
    assert all(p.exact for p in got.prompts)
    assert stable(got.summary()) == stable(want.summary())  # (timings at any depth: ε's measuring seconds too)
    assert len(list((tmp_path / "parts").glob("chunk_*.pkl"))) == 3
    # a rerun resumes from the parts (no task runs); other inputs are refused
    again = invert_batch(_NoTasks(), lm, states, 2, config, true_ids=ids, chunk=2, parts_dir=tmp_path / "parts",
                         progress=False)
    assert [p.ids for p in again.prompts] == ids
    with pytest.raises(SipitError, match="another inversion"):
        invert_batch(_NoTasks(), lm, states[:4], 2, config, chunk=2, parts_dir=tmp_path / "parts", progress=False)


class _NoTasks(LocalEngine):
    def map(self, fn, items, shared=None, gpu=False):
        assert not list(items), "everything was already done"
        return iter(())


def test_cli_engine_ray(tmp_path, capsys, ray_engine):
    from sipit.cli import main

    out = tmp_path / "c"
    args = ["collisions", "--model", "tiny-gpt2", "--corpus", "random:20", "--length", "4", "--layers", "1",
            "--threads", "1", "-q", "-o"]
    assert main([*args, str(out), "--engine", "ray"]) == 0
    assert main([*args, str(tmp_path / "l")]) == 0
    assert stable(read_json(out / "results.json")) == stable(read_json(tmp_path / "l" / "results.json"))
    assert engines._MODELS  # the driver registered its model for its own tasks


def _refuse(shared, item):
    raise SipitError(f"bad item {item}")


def test_task_error_is_one_clear_error(ray_engine):
    with pytest.raises(SipitError, match="^bad item 0$"):
        list(ray_engine.map(_refuse, [0]))


def test_cli_invert_engine_ray(tmp_path, ray_engine):
    from sipit.cli import main

    f = tmp_path / "prompts.txt"
    f.write_text("hello there\nthe cat\nabc\n")
    states = tmp_path / "s.safetensors"
    assert main(["--threads", "1", "capture", "--model", "tiny-gpt2", "--layer", "1", "--file", str(f),
                 "-o", str(states)]) == 0
    for engine in ("local", "ray"):
        assert main(["invert", str(states), "--policy", "random", "--engine", engine, "-q",
                     "-o", str(tmp_path / f"{engine}.jsonl")]) == 0
    rows = {e: [json.loads(s) for s in (tmp_path / f"{e}.jsonl").read_text().splitlines()] for e in ("local", "ray")}
    assert [r["ids"] for r in rows["ray"]] == [r["ids"] for r in rows["local"]] and len(rows["ray"]) == 3
    assert len(list((tmp_path / "ray.parts").glob("chunk_*.pkl"))) == 1  # the resume unit of a Ray run
    assert main(["invert", str(states), "--policy", "bruteforce", "--engine", "ray", "-q"]) == 2


# ---------------------------------------------------------------- many files, audit


@pytest.fixture(scope="module")
def states_dir(tmp_path_factory, capture):
    """Three states files of two models and three layers; c has two chunks of 8 prompts."""
    d = tmp_path_factory.mktemp("states")
    capture(d / "a.safetensors", "tiny-gpt2", 1, ["hello there", "the cat", "abc"])
    capture(d / "b.safetensors", "tiny-llama", 2, ["one two three", "four"])
    capture(d / "c.safetensors", "tiny-gpt2", 2, [f"line {i} of c" for i in range(9)])
    return d


def invert_dir(states_dir, out, *options) -> tuple[int, dict]:
    """`sipit invert DIR -o OUT` -> (exit code, {file: (result rows without timings, summary without timings)})"""
    from sipit.cli import main

    code = main(["--threads", "1", "invert", str(states_dir), "--policy", "random", "-q", "-o", str(out), *options])
    rows = {f.name: ([stable(json.loads(s)) for s in f.read_text().splitlines()],
                     stable(read_json(f.with_suffix(".summary.json")))) for f in sorted(out.glob("*.results.jsonl"))}
    return code, rows


@pytest.fixture(scope="module")
def local_files(states_dir, tmp_path_factory):
    code, rows = invert_dir(states_dir, tmp_path_factory.mktemp("local_files"))
    assert code == 0 and sorted(rows) == ["a.results.jsonl", "b.results.jsonl", "c.results.jsonl"]
    assert [len(r) for r, _ in rows.values()] == [3, 2, 9] and all(s["exact_match_rate"] == 1 for _, s in rows.values())
    return rows


def test_cli_invert_many_files_ray_equals_local(states_dir, local_files, tmp_path, ray_engine, capsys, monkeypatch):
    code, rows = invert_dir(states_dir, tmp_path, "--engine", "ray")
    assert code == 0 and same(rows, local_files)
    assert len(list(tmp_path.glob("c.results.parts/chunk_*.pkl"))) == 2
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and printed[-1].startswith("3 files (0 done before): 14/14 prompts recovered (0 failed)")
    # a crash after c's chunks but before its results: the rerun runs no task and writes c; a and b are skipped
    (tmp_path / "c.results.jsonl").unlink()
    monkeypatch.setattr(engines, "make_engine", lambda *a: _NoTasksRay())
    code, again = invert_dir(states_dir, tmp_path, "--engine", "ray")
    assert code == 0 and same(again, local_files)
    assert capsys.readouterr().out.count("(done before, skipped)") == 2


class _NoTasksRay(_NoTasks):
    name = "ray"


def test_many_files_worker_killed_mid_run(states_dir, local_files, tmp_path, ray_engine, monkeypatch):
    marker, written = tmp_path / "killed", []
    real = engines.atomic_write
    monkeypatch.setattr(engines, "atomic_write", lambda path, data: (written.append(path), real(path, data))[1])
    monkeypatch.setattr(engines, "make_engine", lambda *a: KillingRay(marker))
    code, rows = invert_dir(states_dir, tmp_path / "out", "--engine", "ray")
    assert marker.exists()  # a worker really died
    assert code == 0 and same(rows, local_files)
    chunks = [p for p in written if p.suffix == ".pkl"]
    assert len(chunks) == len(set(chunks)) == 4  # every chunk written once: none lost, none twice
    assert sorted(p.name for p in (tmp_path / "out").glob("*.parts/*")) == ["chunk_00000.pkl"] * 3 + \
        ["chunk_00001.pkl"] + ["key.txt"] * 3


AUDIT = dict(model="tiny-llama", layers="1,2", defenses="none,noise:0.5", prompts="prose:2", length=6, policy="random",
             geometry_prompts=8, utility_text="tech:1", utility_length=12)


def test_audit_ray_equals_local(lm, ray_engine, tmp_path, monkeypatch):
    from sipit.audit import measure
    from sipit.audit.run import AuditConfig, run

    cfg = AuditConfig(**AUDIT)
    want = run(lm, cfg, tmp_path / "local", progress=False)

    def boom(*a, **k):
        raise AssertionError("the driver computed a cell that the engine should have")

    for name in ("attack_invert", "attack_noise", "robustness", "utility"):
        monkeypatch.setattr(measure, name, boom)  # in this process only: Ray's workers measure
    got = run(lm, cfg, tmp_path / "ray", progress=False, engine=ray_engine)
    assert stable(read_json(tmp_path / "ray" / "report.json")) == stable(read_json(tmp_path / "local" / "report.json"))
    assert [c["defense"] for c in got["cells"]] == ["none", "noise:0.5"] * 2 and len(want["layers"]) == 2
    assert len(list((tmp_path / "ray" / "cells").rglob("*.json"))) == 8  # 2 layers × (geometry, robustness, 2 cells)


def test_a_worker_loads_the_drivers_cut_model():
    """A driver that loaded blocks 1..2 of a 12-block model sends max_layer with the model: a worker
    loads the same cut (same fingerprint) instead of the whole model (which fails the check)."""
    lm = load_model("random:gpt2", max_layer=2)
    ref = engines.ModelRef.of(lm)
    assert ref.max_layer == 2 and engines.ModelRef.of(load_model("random:gpt2")).max_layer is None
    engines._MODELS.pop(ref)  # as in a fresh worker process
    worker = engines.worker_model(ref)
    assert worker is not lm and worker.n_layers == 2 and worker.fingerprint == lm.fingerprint
