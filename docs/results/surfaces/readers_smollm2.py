"""Issue 16: SmolLM2 captures written by TransformerLens (default processing and none) and nnsight,
inverted exactly by `sipit invert FILE --model smollm2 --layer 15` (learned policy).

Five 20-token prompts (prose, code, random ids), one batch per tool, layer 15:
- TransformerLens 4 `TransformerBridge.boot_transformers(..., hf_model=...)`: `run_with_cache`, the
  cache's resid hooks saved with torch.save; once as booted (no processing: HF's residual stream) and
  once after `enable_compatibility_mode()` (HookedTransformer's default weight processing);
- nnsight: `LanguageModel(hf_model).trace(ids)` with `model.model.layers[14].output.save()`.

    PYTHONPATH=src python docs/results/surfaces/readers_smollm2.py -o docs/results/surfaces/readers-smollm2.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from sipit.cli import main as sipit
from sipit.corpora import sample
from sipit.io import write_json
from sipit.models import load_model

LAYER = 15  # = TransformerLens blocks.14.hook_resid_post = nnsight model.model.layers[14].output


def captures(ids: torch.Tensor, tmp: Path) -> dict[str, Path]:
    """Each tool's capture of ids [B, T] at LAYER, saved as that tool's users save it. -> {name: file}"""
    from nnsight import LanguageModel
    from transformer_lens.model_bridge import TransformerBridge

    files = {}
    lm = load_model("smollm2")  # a copy for the tools: compatibility mode rewrites its weights
    bridge = TransformerBridge.boot_transformers("smollm2", hf_model=lm.model, tokenizer=lm.tokenizer, device="cpu")
    for mode in ("no_processing", "default"):
        if mode == "default":
            bridge.enable_compatibility_mode(disable_warnings=True)
        _, cache = bridge.run_with_cache(ids)
        files[f"transformer_lens_{mode}"] = tmp / f"tl_{mode}.pt"
        torch.save({k: v.detach() for k, v in cache.cache_dict.items() if "resid" in k}, files[f"transformer_lens_{mode}"])
    lm = load_model("smollm2")
    model = LanguageModel(lm.model, tokenizer=lm.tokenizer)
    with model.trace(ids):
        out = model.model.layers[LAYER - 1].output.save()
    files["nnsight"] = tmp / "nnsight.pt"
    torch.save(out.detach() if isinstance(out, torch.Tensor) else out[0].detach(), files["nnsight"])
    return files


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    lm = load_model("smollm2")
    prompts = sample("prose:2,code:2,random:1", lm.tokenizer, 20, seed=11)
    ids = torch.tensor([p.ids for p in prompts])
    out = dict(layer=LAYER, prompts=[dict(source=p.source, text=p.text) for p in prompts], files={})
    with tempfile.TemporaryDirectory() as d:
        for name, path in captures(ids, Path(d)).items():
            res = path.with_suffix(".results.jsonl")
            t0 = time.perf_counter()
            code = sipit(["--threads", "2", "invert", str(path), "--model", "smollm2", "--layer", str(LAYER), "-q",
                          "-o", str(res)])
            rows = [json.loads(line) for line in res.read_text().splitlines()]
            summary = json.loads(res.with_suffix(".summary.json").read_text())
            exact = sum(r["ids"] == p for r, p in zip(rows, ids.tolist()))
            out["files"][name] = dict(exit_code=code, exact=exact, prompts=len(rows), statuses=[r["status"] for r in rows],
                                      eps=summary["eps"], seconds=round(time.perf_counter() - t0, 1),
                                      seconds_per_prompt_median=summary["seconds_per_prompt_median"])
            print(name, out["files"][name], flush=True)
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    write_json(args.output, out)


if __name__ == "__main__":
    main()
