"""States of a bfloat16 model saved as a user's script saves them, then inverted by `sipit invert`.

SmolLM2-135M in bfloat16 (MODEL and DTYPE in the environment: another model, fp16), N prompts of 20 tokens from each of four sources (sipit.bench.invert.prompts: prose, code,
random ids, chat; seed SEED), one plain transformers forward with output_hidden_states, saved with torch.save as
{"hidden_states": the tuple, "input_ids": ids} (no precision said: sipit reads the states' dtype). Then, per layer,
`sipit invert FILE --model MODEL --layer L --calibration fast` from the source tree SRC (default: this checkout's;
a worktree of an older commit for the code before), with EXTRA arguments (the code before needs --precision bf16:
it ran the model in float32). Prints per layer: eps, statuses, prompts exact, wrong prompts reported ok, the largest
accepted distance, seconds (layerL.jsonl, .summary.json and .log: the run's own).

    python run.py SEED LAYERS N OUT [SRC] [EXTRA...]      e.g. python run.py 1231 1,15,30 4 out-new
    MODEL=gemma3-270m DTYPE=fp16 python run.py ...         (defaults: smollm2, bf16)"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

seed, layers, n, out = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), Path(sys.argv[4])
src = sys.argv[5] if len(sys.argv) > 5 else str(Path(__file__).resolve().parents[4] / "src")
extra = sys.argv[6:]
model, dtype = os.environ.get("MODEL", "smollm2"), os.environ.get("DTYPE", "bf16")
out.mkdir(parents=True, exist_ok=True)
states = out / f"{dtype}-states-seed{seed}.pt"
if not states.exists():
    from sipit.bench.invert import prompts
    from sipit.models import load_model

    torch.set_num_threads(2)
    lm = load_model(model, precision=dtype)
    ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], n, 20, seed)])
    with torch.no_grad():
        hs = lm.model(input_ids=ids, output_hidden_states=True).hidden_states
    torch.save({"hidden_states": hs, "input_ids": ids}, states)
env = {**os.environ, "PYTHONPATH": src}
for layer in layers:
    res = out / f"layer{layer}.jsonl"
    start = time.time()
    run = subprocess.run([sys.executable, "-m", "sipit", "invert", str(states), "--model", model, "--layer",
                          str(layer), "--calibration", "fast", "-q", "-o", str(res), *extra],
                         env=env, capture_output=True, text=True)
    wall = time.time() - start
    (out / f"layer{layer}.log").write_text(run.stdout + run.stderr)
    if not res.with_suffix(".summary.json").exists():  # (exit 1 with results: some prompt failed)
        print(f"layer {layer}: exit {run.returncode}: {run.stderr.strip().splitlines()[-1]}")
        continue
    rows = [json.loads(line) for line in res.read_text().splitlines()]
    summary = json.loads(res.with_suffix(".summary.json").read_text())
    status = {s: sum(r["status"] == s for r in rows) for s in ("ok", "ambiguous", "failed")}
    truth = torch.load(states)["input_ids"].tolist()  # (the code before did not read ids without a mask)
    exact = [r["ids"] == ids for r, ids in zip(rows, truth)]
    wrong_ok = sum(r["status"] == "ok" and not e for r, e in zip(rows, exact))
    print(f"layer {layer}: eps {summary['eps']:.4g}, {status}, exact {sum(exact)}/{len(rows)}, "
          f"wrong but ok {wrong_ok}, largest accepted distance {summary['max_accepted_distance']:.3g}, inversion {sum(r['seconds'] for r in rows):.1f} s, wall {wall:.0f} s")
