"""States of SmolLM2 in bfloat16 as other tools capture them, inverted by `sipit invert` (no --precision: the file's
dtype says it).

N prompts of 20 tokens from each of four sources (sipit.bench.invert.prompts: prose, code, random ids, chat; seed
SEED) through SmolLM2-135M loaded in bfloat16, captured at layer LAYER by
- transformers: one forward with output_hidden_states, the tuple saved with the tokenizer's ids and mask;
- TransformerLens 4 `TransformerBridge.boot_transformers(..., hf_model=...)` `run_with_cache`, the cache's resid
  hooks saved, as booted (no processing) and after `enable_compatibility_mode()` (HookedTransformer's weight
  processing: its folded weights round to bfloat16 otherwise than the model's own);
- nnsight: `LanguageModel(hf_model).trace(ids)`, `model.model.layers[LAYER - 1].output.save()`.
Then `sipit invert FILE --model smollm2 --layer LAYER --calibration fast --max-seconds 60` on each. Prints per file:
eps, statuses, exact, wrong prompts reported ok, the largest accepted distance, the states' gap to the
transformers forward (median and largest relative distance over positions); writes OUT/tools-SEED-LLAYER.json.

    python tools.py SEED LAYER N OUT        e.g. python tools.py 1277 15 4 tools-1277"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

seed, layer, n, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
out.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(2)


def captures(ids: torch.Tensor) -> dict[str, tuple[Path, torch.Tensor]]:
    """Each tool's capture of ids [B, T] at layer, saved as its users save it. -> {name: (file, states [B, T, d])}"""
    from nnsight import LanguageModel
    from transformer_lens.model_bridge import TransformerBridge

    from sipit.models import load_model

    files = {}
    lm = load_model("smollm2", precision="bf16")
    mask = torch.ones_like(ids)
    with torch.no_grad():
        hs = lm.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    files["transformers"] = (out / "transformers.pt", hs[layer])
    torch.save({"hidden_states": hs, "input_ids": ids, "attention_mask": mask}, files["transformers"][0])
    model = LanguageModel(lm.model, tokenizer=lm.tokenizer)
    with model.trace(ids):
        saved = model.model.layers[layer - 1].output.save()
    h = saved.detach() if isinstance(saved, torch.Tensor) else saved[0].detach()
    files["nnsight"] = (out / "nnsight.pt", h)
    torch.save(h, files["nnsight"][0])
    lm = load_model("smollm2", precision="bf16")  # a copy for TransformerLens: compatibility mode rewrites its weights
    bridge = TransformerBridge.boot_transformers("smollm2", hf_model=lm.model, tokenizer=lm.tokenizer, device="cpu")
    for mode in ("no_processing", "default"):
        if mode == "default":
            bridge.enable_compatibility_mode(disable_warnings=True)
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids)
        path = out / f"transformer_lens_{mode}.pt"
        resid = {k: v.detach() for k, v in cache.cache_dict.items() if "resid" in k}
        torch.save(resid, path)
        files[f"transformer_lens_{mode}"] = (path, resid[f"blocks.{layer - 1}.hook_resid_post"])
    return files


def main() -> None:
    from sipit.bench.invert import prompts
    from sipit.models import load_model

    lm = load_model("smollm2", precision="bf16")
    ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], n, 20, seed)])
    report = dict(seed=seed, layer=layer, prompts=len(ids), files={})
    files = captures(ids)
    ref = files["transformers"][1].float()
    for name, (path, states) in files.items():
        gap = ((states.float() - ref).norm(dim=-1) / ref.norm(dim=-1)).flatten()
        res = out / f"{name}-layer{layer}.jsonl"
        start = time.time()
        run = subprocess.run([sys.executable, "-m", "sipit", "invert", str(path), "--model", "smollm2", "--layer",
                              str(layer), "--calibration", "fast", "--max-seconds", "60", "-q", "-o", str(res)],
                             capture_output=True, text=True)
        (out / f"{name}-layer{layer}.log").write_text(run.stdout + run.stderr)
        row = dict(dtype=str(states.dtype), gap_median=float(gap.median()), gap_max=float(gap.max()),
                   exit_code=run.returncode, wall_seconds=round(time.time() - start, 1))
        if res.with_suffix(".summary.json").exists():
            rows = [json.loads(line) for line in res.read_text().splitlines()]
            summary = json.loads(res.with_suffix(".summary.json").read_text())
            exact = [r["ids"] == truth for r, truth in zip(rows, ids.tolist())]
            row.update(eps=summary["eps"], statuses={s: sum(r["status"] == s for r in rows) for s in ("ok", "ambiguous", "failed")},
                       exact=sum(exact), wrong_ok=sum(r["status"] == "ok" and not e for r, e in zip(rows, exact)),
                       wrong_ambiguous=sum(r["status"] == "ambiguous" and not e for r, e in zip(rows, exact)),
                       max_accepted_distance=summary["max_accepted_distance"],
                       seconds_median=summary["seconds_per_prompt_median"])
        else:
            row["error"] = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
        report["files"][name] = row
        print(name, row, flush=True)
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    (out / f"tools-{seed}-layer{layer}.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
