"""Every layer of a model calibrated for the learned policy on a GPU, as `sipit calibrate --layers all` does
(calibrate_cached_taps: as few passes as fit the memory left, each layer saved as it is made), then each fast
calibration's load timed (it makes its [V, d] predictions again from the embedding rows).

    PYTHONPATH=src python docs/results/gpu/calibrate_all.py OUT.json [MODEL] [PRECISION] [MODE]

Defaults: random:llama-3.1-8b, bf16, fast. Writes the passes as planned (layers per pass, from the memory free
before), the seconds of each layer and per layer per billion parameters, the peak memory the fit allocated,
the files' sizes, and three layers' load seconds. Runs on the CPU too (no GPU: peak memory unknown).
"""
import json
import sys
import time

import torch

from sipit.invert.learned.cache import cache_path, load_cached
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.fit import _passes, calibrate_cached_taps
from sipit.models import LayerTap, load_model
from sipit.models.device import memory_left, sync

out = sys.argv[1]
model, precision, mode = (sys.argv[2:] + ["random:llama-3.1-8b", "bf16", "fast"][len(sys.argv) - 2:])[:3]
device = "cuda" if torch.cuda.is_available() else "cpu"
cuda = device == "cuda"

t = time.perf_counter()
lm = load_model(model, precision=precision, device=device)
sync(lm.device)
load_seconds = time.perf_counter() - t
billions = sum(p.numel() for p in lm.model.parameters()) / 1e9
config = calibration_config(mode)
taps = [LayerTap(lm, layer) for layer in range(1, lm.n_layers + 1)]
report = dict(device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__, model=lm.name,
              precision=precision, calibration=mode, parameters_billions=round(billions, 3),
              model_load_seconds=round(load_seconds, 1), memory_left_gb=round(memory_left(lm.device) / 1e9, 1),
              passes=[[tap.layer for tap in group] for group in _passes(lm, taps, config)])
if cuda:
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
t = time.perf_counter()
seconds = calibrate_cached_taps(lm, taps, config)
sync(lm.device)
total = time.perf_counter() - t
fitted = [s for s in seconds.values() if s > 0]
report.update(seconds=round(total, 1), layers_fitted=len(fitted),
              seconds_per_layer=round(total / max(len(fitted), 1), 2),
              seconds_per_layer_per_billion=round(total / max(len(fitted), 1) / billions, 2),
              seconds_by_layer={tap.layer: round(seconds[tap.key], 2) for tap in taps},
              peak_gb_above_model=round((torch.cuda.max_memory_allocated() - base) / 1e9, 2) if cuda else None,
              files_mb={tap.layer: round(cache_path(tap, config).stat().st_size / 1e6, 1) for tap in taps})
loads = {}
for tap in (taps[0], taps[len(taps) // 2], taps[-1]):
    t = time.perf_counter()
    cal = load_cached(tap, config)
    sync(lm.device)
    loads[tap.layer] = round(time.perf_counter() - t, 2)
    assert cal is not None, f"layer {tap.layer}'s calibration did not load"
    del cal
report["load_seconds"] = loads
print(json.dumps(report))
with open(out, "w") as f:
    json.dump(report, f, indent=1)
