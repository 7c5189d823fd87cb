"""verify.near_neighbours at an older commit and now, on real models' embeddings: seconds of each (2 threads), the
peak memory it adds to the process that loaded the model, and whether both find the same near-duplicate lists (and
the cached file, where a load made one).

    python near_neighbours_ab.py OLD_COMMIT MODEL...        e.g. c0322b0 gemma3-270m smollm2

Each version runs in fresh processes, alternating (now, old, now, old), twice in each: the first call of a process
pays for its fresh memory (Gemma-3-270M's rows in float64 are 1.3 GB), and one process measuring both versions gave
the second one the first one's freed pages (35 s where fresh processes take 73-81 s)."""
import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import time

import torch

from sipit.invert import verify
from sipit.models import load_model
from sipit.models.load import cache_dir


def old_module(commit: str):
    source = subprocess.run(["git", "show", f"{commit}:src/sipit/invert/verify.py"], capture_output=True, text=True,
                            check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("sipit.invert.verify_old", f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def child(version: str, name: str, out: str) -> None:
    """One process: the version's two calls on the model's rows -> out (JSON: seconds, lists)."""
    torch.set_num_threads(2)
    module = verify if version == "now" else old_module(version)
    lm = load_model(name)
    E, dups = lm.embedding_rows(), verify.duplicate_classes(lm)
    seconds, loaded = [], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (KiB)
    for _ in range(2):
        t = time.perf_counter()
        lists = module.near_neighbours(E, dups)
        seconds.append(time.perf_counter() - t)
    cached = cache_dir() / "near" / f"v2-{lm.embedding_fingerprint}-{verify.NEAR_REL:g}.json"
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - loaded) / 2 ** 20
    json.dump({"seconds": seconds, "peak_gib": peak, "lists": lists, "V": E.shape[0], "d": E.shape[1],
               "cached": json.loads(cached.read_text()) if cached.exists() else None}, open(out, "w"))


if sys.argv[1] == "--child":
    child(*sys.argv[2:])
    sys.exit()
old_commit, models = sys.argv[1], sys.argv[2:]
for name in models:
    runs = {"now": [], old_commit: []}
    for version in ["now", old_commit] * 2:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            subprocess.run([sys.executable, __file__, "--child", version, name, f.name], check=True,
                           stderr=subprocess.DEVNULL)
            runs[version].append(json.load(open(f.name)))
    new, was = runs["now"][0], runs[old_commit][0]
    same = all(r["lists"] == new["lists"] for r in runs["now"] + runs[old_commit])

    def s(version):
        return (" / ".join(", ".join(f"{x:.1f}" for x in r["seconds"]) for r in runs[version]) + " s, peak +"
                + " / ".join(f"{r['peak_gib']:.1f}" for r in runs[version]) + " GiB")
    line = (f"{name}: V {new['V']:,}, d {new['d']}: {old_commit} {s(old_commit)}, now {s('now')} (two processes each, "
            f"two calls in each); {len(new['lists'])} tokens listed, {sum(map(len, new['lists'].values()))} "
            f"entries; the same lists: {same}")
    if new["cached"] is not None:
        line += f"; as the cached file: {new['lists'] == new['cached']}"
    print(line, flush=True)
