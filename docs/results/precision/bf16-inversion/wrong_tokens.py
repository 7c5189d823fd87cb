"""Where a run went wrong: for each prompt of run.py's OUT folder whose recovered ids differ from the truth, the first
position where they do, and there the true token's and the recovered one's relative distance to the observation,
recomputed in bfloat16 by a pass of the prefix and the token (as the loop's passes do) and by a full forward of the
prompt's length (as the observation was made), and in float32 by a pass.

    python wrong_tokens.py OUT LAYER        e.g. python wrong_tokens.py new-1231 30 (OUT holds run.py's states file)"""
import json
import sys
from pathlib import Path

import torch

from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
out, layer = Path(sys.argv[1]), int(sys.argv[2])
saved = torch.load(next(out.glob("bf16-states-seed*.pt")))
truth = saved["input_ids"].tolist()
final_norm = layer == len(saved["hidden_states"]) - 1  # (the tuple's last entry is after the final norm)
rows = [json.loads(line) for line in (out / f"layer{layer}.jsonl").read_text().splitlines()]
taps = {p: LayerTap(load_model("smollm2", precision=p), layer, final_norm=final_norm) for p in ("bf16", "fp32")}
for i, r in enumerate(rows):
    if r["ids"] == truth[i]:
        continue
    t = next(k for k in range(len(r["ids"])) if r["ids"][k] != truth[i][k])
    obs = saved["hidden_states"][layer][i, t].double()

    def rel(h):
        return (h.double() - obs).norm().item() / obs.norm().item()

    parts = []
    for name, v in (("truth", truth[i][t]), ("recovered", r["ids"][t])):
        pass_ids = torch.tensor([truth[i][:t] + [v]])
        full_ids = torch.tensor([truth[i][:t] + [v] + truth[i][t + 1:]])
        parts.append(f"{name} {taps['bf16'].lm.decode([v])!r}: bf16 pass {rel(taps['bf16'].states(pass_ids)[0, t]):.4f}, "
                     f"full {rel(taps['bf16'].states(full_ids)[0, t]):.4f}, fp32 pass "
                     f"{rel(taps['fp32'].states(pass_ids)[0, t]):.4f}")
    print(f"prompt {i} ({r['status']}) position {t}: " + "; ".join(parts), flush=True)
