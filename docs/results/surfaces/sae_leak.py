"""Do an SAE's latents reveal the prompt? A TopK SAE trained here on SmolLM2's states at one layer (text of the tech
and prose corpora, seed 0), then held-out prompts (prose, code, chat, random ids of the bench's fresh SEED) captured
and inverted through the CLI, `sipit capture --surface sae:DIR` and `sipit invert`, beside their plain states.

    python sae_leak.py LAYER SEED [TRAIN_PROMPTS STEPS K LATENTS]     e.g. 15 1087 (defaults 800 800 32 4608)

Writes its SAE (SAELens' layout), files and results under runs/sae-L{LAYER}/ and prints one JSON line."""
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from sipit.bench.invert import leaked, prompts
from sipit.capture import capture
from sipit.corpora import sample
from sipit.models import load_model
from sipit.models.sae import SAE

torch.set_num_threads(2)
layer, seed = int(sys.argv[1]), int(sys.argv[2])
n_train, steps, k, n = (int(x) for x in (sys.argv[3:] + ["800", "800", "32", "4608"][len(sys.argv) - 3:])[:4])
run = Path(__file__).parent / "runs" / f"sae-L{layer}"
run.mkdir(parents=True, exist_ok=True)
lm = load_model("smollm2")

# training states: 2 x n_train spans of 64 tokens (tech and prose, seed 0)
t0 = time.perf_counter()
train_ids = [p.ids for kind in ("tech", "prose") for p in sample(f"{kind}:{n_train}", lm.tokenizer, 64, seed=0)]
X = torch.cat(capture(lm, train_ids, layer)).float()  # [N, d]
X = X[torch.randperm(len(X), generator=torch.Generator().manual_seed(0))]
states_s = time.perf_counter() - t0
print(f"{len(X)} training states in {states_s:.0f} s", file=sys.stderr)

# a TopK SAE (Gao et al.): decoder rows of unit norm, encoder tied at init, b_dec at the mean; Adam on the MSE
t0 = time.perf_counter()
g = torch.Generator().manual_seed(0)
d = X.shape[1]
W_dec = torch.randn(n, d, generator=g)
W_dec /= W_dec.norm(dim=1, keepdim=True)
params = dict(W_enc=W_dec.T.clone().requires_grad_(), b_enc=torch.zeros(n, requires_grad=True),
              W_dec=W_dec.requires_grad_(), b_dec=X.mean(0).clone().requires_grad_())
opt = torch.optim.Adam(params.values(), lr=1e-3)
held = X[-4096:]
train = X[:-4096]
for step in range(steps):
    x = train[torch.randint(0, len(train), (2048,), generator=g)]
    sae = SAE(*(params[n_] for n_ in ("W_enc", "b_enc", "W_dec", "b_dec")), "topk", k=k)
    loss = (sae.decode(sae.encode(x)) - x).pow(2).sum(1).mean() / (x - x.mean(0)).pow(2).sum(1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        params["W_dec"] /= params["W_dec"].norm(dim=1, keepdim=True)
train_s = time.perf_counter() - t0
print(f"trained in {train_s:.0f} s", file=sys.stderr)
sae = SAE(*(params[n_].detach().clone() for n_ in ("W_enc", "b_enc", "W_dec", "b_dec")), "topk", layer=layer, k=k,
          hook_name=f"blocks.{layer - 1}.hook_resid_post")
with torch.no_grad():
    recon = sae.decode(sae.encode(held))
    fvu = float((recon - held).pow(2).sum() / (held - held.mean(0)).pow(2).sum())
sae_dir = sae.save(run / "sae")

# held-out prompts: 5 per source, 20 tokens, the bench's sampler with a fresh seed; their latents and states captured
# and inverted by the CLI (the learned policy's full calibration at each surface, cached after its first use)
test = prompts(lm, ["prose", "code", "chat", "random"], 5, 20, seed)
(run / "ids.txt").write_text("".join(" ".join(map(str, p)) + "\n" for _, p in test))
out = {"layer": layer, "seed": seed, "train_tokens": len(X), "states_seconds": round(states_s, 1),
       "train_seconds": round(train_s, 1), "steps": steps, "k": k, "latents": n, "held_out_fvu": round(fvu, 4),
       "prompts_in_training_text": leaked([p for _, p in test], torch.tensor(train_ids))}
with torch.no_grad():  # the held-out prompts' states: latents per position, each state's relative reconstruction error
    h = torch.cat(capture(lm, [p for _, p in test], layer)).float()
    latents = sae.encode(h)
    rel = (sae.decode(latents) - h).norm(dim=1) / h.norm(dim=1)
out["held_out_L0"] = float((latents > 0).float().sum(1).mean())
out["held_out_relative_error_median_max"] = [round(float(rel.median()), 4), round(float(rel.max()), 4)]
for surface in (f"sae:{sae_dir}", "states"):
    name = "sae" if surface != "states" else "states"
    f = run / f"{name}-{seed}.safetensors"
    subprocess.run(["sipit", "capture", "--model", "smollm2", "--layer", str(layer), "--surface", surface, "--ids",
                    str(run / "ids.txt"), "-o", str(f)], check=True)
    t0 = time.perf_counter()
    cli = subprocess.run(["sipit", "invert", str(f), "-q"], capture_output=True, text=True)
    summary = json.loads(f.with_suffix(".results.summary.json").read_text())
    rows = [json.loads(line) for line in f.with_suffix(".results.jsonl").read_text().splitlines()]
    out[name] = {"exact": sum(r["exact"] for r in rows), "prompts": len(rows),
                 "statuses": sorted({r["status"] for r in rows}), "exit": cli.returncode,
                 "seconds_per_prompt_median": summary["seconds_per_prompt_median"],
                 "seconds_total": summary["seconds_total"], "calibration_seconds": summary.get("calibration_seconds"),
                 "wall_seconds": round(time.perf_counter() - t0, 1), "eps": summary["eps"],
                 "candidates_per_position": summary["candidates_per_position"],
                 "median_seconds_by_source": {kind: sorted(r["seconds"] for (k_, _), r in zip(test, rows) if k_ == kind)[2]
                                              for kind in ("prose", "code", "chat", "random")},
                 "last_line": cli.stdout.strip().splitlines()[-1]}
print(json.dumps(out))
