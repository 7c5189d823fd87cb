"""Would a lens to a layer below the last, with the model's own blocks from there up, fix more wrong first guesses
than the linear lens to the last layer? For each target layer L', a ridge lens h_{L'} ≈ ĥ W + b is fitted on the
first ROWS text rows of the calibration corpus; the prior of a prompt is then the LM's next-token log-probs from its
translated states (next_token_logprobs_from(L', ·): blocks L'.. and the head). The guesses' candidates (the screen's
best) are re-ranked by score + 2 w log p, where the calibration's lens gate reads the prompt as text. 'cal' is the
calibration's own lens (L' = last, logits), 'oracle' the blocks above the tap on the observed states (L' = LAYER:
exact, costs the part of a forward above the tap). Prints wrong first guesses, prompts with none, and the
milliseconds of one prompt's prior (median of 7, float32 and bfloat16 blocks).

    python lens_depth.py LAYER SEEDS TARGETS WEIGHTS [ROWS]      e.g. 15 5 24,27,29 5,10"""
import sys

import torch

from common import bench_prompts, median_ms, ranker_at, smollm2
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.data import calibration_ids
from sipit.invert.learned.fit import Moments
from sipit.models import LayerTap
from sipit.models.tap import run_taps

layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
targets, weights = [int(x) for x in sys.argv[3].split(",")], [float(x) for x in sys.argv[4].split(",")]
rows = int(sys.argv[5]) if len(sys.argv) > 5 else 256
lm = smollm2()
tap, rk = ranker_at(lm, layer)
cal, U = rk.cal, rk.unembed
cfg = calibration_config("full")
ids = calibration_ids(lm, 64 * rows * 2, 64, 0.0)[:rows]
moments = {L: Moments() for L in targets}
with torch.no_grad():
    for i in range(0, len(ids), 16):
        h, *hs = [x.float() for x in run_taps(lm, [tap, *[LayerTap(lm, L) for L in targets]], ids[i:i + 16])]
        for L, hl in zip(targets, hs):
            moments[L].add(h.reshape(-1, h.shape[-1]), hl.reshape(-1, hl.shape[-1]))
lenses = {}
for L, m in moments.items():
    Ws, mx, my, _ = m.ridge(cfg.ridge)
    lenses[L] = (Ws.float(), (my - mx @ Ws).float())


def prior(name, s):
    """log p (or the lens logits) of every token after positions 0..T-2 of states s [T, d]. [T-1, V]"""
    with torch.no_grad():
        if name == "cal":
            return lm.norm(s[:-1] @ cal.lens_w + cal.lens_b).float() @ U.T
        if name == "oracle":
            return lm.next_token_logprobs_from(layer, s[:-1])
        W, b = lenses[name]
        return lm.next_token_logprobs_from(name, s[:-1] @ W + b)


names = ["cal", *targets, "oracle"]
for seed in seeds:
    _, tids, S = bench_prompts(lm, tap, seed)
    base = [rk.screen_best(rk.context_residuals(s)) for s in S]
    gate = [rk.lens_text_score(rk.lens_logits(s[:-1], top)) > cal.lens_gate for s, (top, _) in zip(S, base)]
    wrong0 = sum(int((top[:, 0] != p[1:]).sum()) for p, (top, _) in zip(tids, base))
    print(f"seed {seed}: plain {wrong0} wrong of {sum(len(p) - 1 for p in tids)}; gate on for {sum(gate)}/{len(S)}", flush=True)
    priors = {name: [prior(name, s) if on else None for s, on in zip(S, gate)] for name in names}
    for name in names:
        for w in weights:
            wrong = none = 0
            for p, (top, sc), lp in zip(tids, base, priors[name]):
                g = top[:, 0] if lp is None else top.gather(1, (sc + 2 * w * lp.gather(1, top)).argmax(1, keepdim=True))[:, 0]
                k = int((g != p[1:]).sum())
                wrong, none = wrong + k, none + (k == 0)
            print(f"seed {seed} prior {name} w {w}: wrong {wrong}, prompts with none {none}/{len(S)}", flush=True)
s = S[0]
for name in names:
    print(f"prior {name}: {median_ms(lambda: prior(name, s)):.1f} ms a prompt (float32)", flush=True)
