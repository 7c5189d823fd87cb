"""Loading Qwen2.5-1.5B's fast calibration of layer 14 from the cached file as saved before 4e6d7cf (no p0_sq: the
norms made from the [V, d] p0 product, as every load did then) against the same calibration re-saved by this code
(p0_sq stored, p0 never made), alternating, 2 each, the model's fingerprint computed first; the same tensors.

    python fast_load_ab.py OLD_FILE      (the cached file, e.g. ~/.cache/sipit/learned/<key>-L14-<settings>.safetensors)"""
import sys
import time

import torch

from sipit.invert.learned.cache import Calibration
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
lm = load_model("qwen2.5-coder-1.5b")
old, new = sys.argv[1], "/tmp/fast_load_ab.safetensors"
lm.fingerprint_through(LayerTap(lm, 14).blocks_read)
Calibration.load(old, embedding=lm.embedding_rows).save(new)
seconds, loaded = {"old file": [], "new file": []}, {}
for _ in range(2):
    for name, path in (("old file", old), ("new file", new)):
        t = time.perf_counter()
        loaded[name] = Calibration.load(path, embedding=lm.embedding_rows)
        seconds[name].append(round(time.perf_counter() - t, 2))
        print(name, seconds[name][-1], flush=True)
for f in ("P", "P_sq", "p_proj", "p0_sq"):
    print(f, "the same:", torch.equal(getattr(loaded["old file"], f), getattr(loaded["new file"], f)))
print(seconds)
