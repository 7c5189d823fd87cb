"""Search passes sized by free memory (LayerTap.rows_that_fit) on a GPU, where the size binds: Llama-3.1-8B's
architecture at random init (bf16), layer 16, prefixes up to thousands of tokens. Each search row carries its
own copy of the prefix's keys and values, so 4,096 rows on a long prefix would not fit.

    PYTHONPATH=src python docs/results/gpu/long_prefix.py OUT.json [LENGTHS] [PROMPT_TOKENS] [SECONDS]

For each prefix length (default 160,512,1024,2048): the rows the tap allows of 4,096, one pass of that many
candidates appended to the prefix (keep=True, as the search runs it), the pass's peak memory against the
tap's estimate and the memory free before it, its seconds. Then one random-id prompt of PROMPT_TOKENS
(default 160) inverted by the learned policy, capped at SECONDS (default 240: a capped prompt reports the
positions it recovered). Writes the JSON as each part ends.
"""
import json
import sys
import time

import torch

from sipit.invert import InvertConfig, invert
from sipit.models import LayerTap, load_model

out = sys.argv[1]
lengths = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "160,512,1024,2048").split(",")]
prompt_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 160
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 240.0
layer, cap = 16, 4096

t = time.perf_counter()
lm = load_model("random:llama-3.1-8b", precision="bf16", device="cuda", max_layer=layer)
tap = LayerTap(lm, layer)
report = {"device": torch.cuda.get_device_name(), "model": "random:llama-3.1-8b", "precision": "bf16",
          "layer": layer, "load_seconds": round(time.perf_counter() - t, 1), "passes": []}
per_position, fixed = tap._row_bytes
g = torch.Generator().manual_seed(1)


def save():
    with open(out, "w") as f:
        json.dump(report, f, indent=1)


for length in lengths:
    prefix = tap.prefill(torch.randint(0, lm.vocab_size, (length - 1,), generator=g))
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    rows = tap.rows_that_fit(length, cap)
    cand = torch.randint(0, lm.vocab_size, (rows, 1), generator=g)
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    try:
        states, grown = tap.extend(prefix, cand, keep=True)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as e:  # the estimate was too low: that is the finding
        report["passes"].append({"prefix_tokens": length, "rows": rows, "out_of_memory": str(e)[:200]})
        save()
        raise
    entry = {"prefix_tokens": length, "rows": rows, "pass_seconds": round(time.perf_counter() - t, 3),
             "free_gb_before": round(free / 1e9, 2), "estimate_gb": round(rows * (length * per_position + fixed) / 1e9, 2),
             "peak_gb": round((torch.cuda.max_memory_allocated() - base) / 1e9, 2)}
    entry["peak_over_free"] = round(entry["peak_gb"] / entry["free_gb_before"], 3)
    print(entry, flush=True)
    report["passes"].append(entry)
    del prefix, states, grown, cand
    torch.cuda.empty_cache()
    save()

ids = torch.randint(0, lm.vocab_size, (1, prompt_tokens), generator=g).to(lm.device)
r = invert(lm, tap.states(ids), layer, InvertConfig(max_seconds=seconds), progress=False, true_ids=ids.tolist(),
           tap=tap).prompts[0]
found = [p for p in r.positions if p.token is not None]  # a capped prompt's last position failed: no token
right = sum(int(p.token == x) for p, x in zip(found, ids[0].tolist()))
report["long_prompt"] = {
    "tokens": prompt_tokens, "status": r.status, "exact": r.exact, "positions_recovered": len(found),
    "positions_right": right, "seconds": round(r.seconds, 1), "pass_seconds": round(r.pass_seconds, 1),
    "tap_calls": r.tap_calls, "max_seconds": seconds,
    "seconds_per_position": round(r.seconds / max(1, len(found)), 2),
    "verified_per_position": round(sum(p.tried for p in found) / max(1, len(found))),
    "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2)}
print(report["long_prompt"], flush=True)
save()
