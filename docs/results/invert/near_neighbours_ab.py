"""verify.near_neighbours at an older commit and now, on real models' embeddings: seconds of each (2 threads) and
whether both find the same near-duplicate lists (and the cached file, where a load made one).

    python near_neighbours_ab.py OLD_COMMIT MODEL...        e.g. c0322b0 gemma3-270m smollm2"""
import importlib.util
import json
import subprocess
import sys
import tempfile
import time

import torch

from sipit.invert import verify
from sipit.models import load_model
from sipit.models.load import cache_dir

torch.set_num_threads(2)
old_commit, models = sys.argv[1], sys.argv[2:]
source = subprocess.run(["git", "show", f"{old_commit}:src/sipit/invert/verify.py"], capture_output=True, text=True,
                        check=True).stdout
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(source)
spec = importlib.util.spec_from_file_location("sipit.invert.verify_old", f.name)
old = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = old
spec.loader.exec_module(old)


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


for name in models:
    lm = load_model(name)
    E, dups = lm.embedding_rows(), verify.duplicate_classes(lm)
    new, t_new = timed(verify.near_neighbours, E, dups)
    was, t_old = timed(old.near_neighbours, E, dups)
    cached = cache_dir() / "near" / f"v2-{lm.embedding_fingerprint}-{verify.NEAR_REL:g}.json"
    line = (f"{name}: V {E.shape[0]:,}, d {E.shape[1]}: {old_commit} {t_old:.1f} s, now {t_new:.1f} s; "
            f"{len(new)} tokens listed, {sum(map(len, new.values()))} entries; the same lists: {new == was}")
    if cached.exists():
        line += f"; as the cached file: {new == {int(k): v for k, v in json.loads(cached.read_text()).items()}}"
    print(line, flush=True)
