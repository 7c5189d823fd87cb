"""Where the positions that needed deep searches rank the true token: the main ranker (its scores without anchors),
the lens (the LM head read through the calibration's linear lens from ĥ_{t-1}) and the LM itself on the true
prefix (next_token_logprobs_from: the blocks above the tap). Bench prompts, one at a time.

    python deep_search_ranks.py LAYER SEEDS [MIN_TRIED]      e.g. 15 139,149,151,157,163 80"""
import sys

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model

layer, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
least = int(sys.argv[3]) if len(sys.argv) > 3 else 80
torch.set_num_threads(2)
lm = load_model("smollm2")
tap = LayerTap(lm, layer)
engine = None


def rank(scores, v):
    return int((scores > scores[v]).sum())


for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    ids = torch.tensor([p for _, p in data])
    states = tap.states(ids)
    if engine is None:
        engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
                       eps=tolerance_for(tap, {states.dtype}).eps)
        ranker = engine.policy.ranker
        cal = ranker.cal
    for i in range(len(ids)):
        result = engine.invert_prompt(states[i], ids[i].tolist())
        target = states[i].float()
        for t, q in enumerate(result.positions):
            if t == 0 or q.tried < least:
                continue
            v = int(ids[i, t])
            main = ranker.scores(target, t, False)
            lens = ranker.unembed @ lm.norm(target[t - 1] @ cal.lens_w + cal.lens_b).float() if cal.lens_w is not None else None
            above = lm.next_token_logprobs_from(layer, target[:t])[-1]
            print(f"seed {seed} {data[i][0]:6s} position {t:2d}: {q.tried:4d} tried; true token's rank: main {rank(main, v):5d}, "
                  f"lens {rank(lens, v) if lens is not None else '-':>5}, the LM on the prefix {rank(above, v):5d}  "
                  f"{lm.decode(ids[i, max(0, t - 5):t].tolist())!r} -> {lm.decode([v])!r}")
