"""The paper's gradient policy where the learned ranker's tail is: at positions of a recovered prompt, from the mean
embedding and from the fast ranker's best, Adam on the embedding fed at t (the verified prefix before it) toward the
observed state, the true token's rank among the embedding rows nearest the optimised vector after 5 / 10 / 20 / 40
steps, and the loss. STATES: a `sipit capture` file; RESULTS: its `sipit invert` results JSONL (the recovered ids).

    python gradient_tail.py STATES RESULTS PROMPT LAYER POSITIONS        e.g. s30.safetensors r30 4 30 14,2,16"""
import json
import sys
import time

import torch

from common import ranker_at, smollm2
from sipit.models import LayerTap
from sipit.states import load_states

path, results, i, layer = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lm = smollm2()
tap = LayerTap(lm, layer)
S = load_states(path).prompts[i].float()
ids = json.loads(open(results).readlines()[i])["ids"]
E = lm.embedding_rows().float()
E_sq = (E.double() ** 2).sum(1)
_, ranker = ranker_at(lm, layer, "fast")


def rank(scores, v):
    return int((scores > scores[v]).sum())


for t in [int(a) for a in sys.argv[5].split(",")]:
    v, prefix, target = ids[t], tap.prefill(torch.tensor(ids[:t])), S[t]
    best = int(ranker.scores(S, t, False).argmax())
    for start in ("mean", "best"):
        e = (E.mean(0) if start == "mean" else E[best]).clone().requires_grad_(True)
        opt = torch.optim.Adam([e], lr=0.1 * float(E.norm(dim=1).mean()))
        t0, seen = time.perf_counter(), []
        for step in range(1, 41):
            opt.zero_grad()
            loss = 0.5 * ((tap.extend_embeds(prefix, e[None])[0] - target) ** 2).sum() / (target ** 2).sum()
            loss.backward()
            opt.step()
            if step in (5, 10, 20, 40):
                with torch.no_grad():
                    seen.append((step, rank(-(E_sq - 2 * (E.double() @ e.detach().double())), v), round(float(loss), 4)))
        print(f"t={t} {lm.decode([v])!r} from the {start}: (step, the truth's rank by nearest row, loss) {seen}, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
