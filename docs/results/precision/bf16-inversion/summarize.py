"""The README's table from run.py's folders: per folder and layer, eps, statuses, prompts exact against the prompts'
ids (sampled again as run.py sampled them; the code before wrote no `exact`: it read no ids without a mask), wrong
prompts reported ok or ambiguous, the largest accepted distance and the median seconds a prompt.

    python summarize.py FOLDER...        e.g. python summarize.py old-1231 new-1231 sure-1231 old-1237 sure-1237
(a folder's name ends with its seed)"""
import json
import sys
from pathlib import Path

from sipit.bench.invert import prompts
from sipit.models import load_model

lm = load_model("smollm2")
for folder in map(Path, sys.argv[1:]):
    seed = int(folder.name.rsplit("-", 1)[1])
    truth = [p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 4, 20, seed)]
    for layer in (1, 15, 30):
        path = folder / f"layer{layer}.jsonl"
        if not path.exists():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        s = json.loads(path.with_suffix(".summary.json").read_text())
        exact = [r["ids"] == t for r, t in zip(rows, truth)]
        status = "/".join(str(sum(r["status"] == k for r in rows)) for k in ("ok", "ambiguous", "failed"))
        wrong = {k: sum(r["status"] == k and not e for r, e in zip(rows, exact)) for k in ("ok", "ambiguous")}
        print(f"{folder.name} layer {layer}: eps {s['eps']:.4g}, ok/ambiguous/failed {status}, exact {sum(exact)}/"
              f"{len(rows)}, wrong ok {wrong['ok']}, wrong ambiguous {wrong['ambiguous']}, largest accepted "
              f"{s['max_accepted_distance']:.3g}, median {s['seconds_per_prompt_median']} s")
