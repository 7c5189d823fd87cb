"""Position 0 with the first k of the table subspace's columns (128, 64, 32, 16): the milliseconds of one prompt's
LinearRanker.position0 alone, whether the guess is right, and the certified margin (the least lower bound or exact
distance of any other token) over the 40 seed-5 bench prompts, at layers 1 and 15 (full calibration). Since
cache VERSION 7 a calibration stores only LearnedConfig.table_rank (64) columns: k = 128 needs one fitted with
table_rank=128, and is skipped otherwise.

    python position0_rank.py"""
import time, statistics, torch
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
lm = load_model("smollm2")
for layer in (1, 15):
    tap = LayerTap(lm, layer)
    ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 10, 20, 5)])
    states = tap.states(ids)
    eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
    rk = eng.policy.ranker; c = rk.cal
    full_proj = c.t_proj
    for k in (x for x in (128, 64, 32, 16) if x <= full_proj.shape[1]):  # (a calibration with table_rank = k)
        c.t_proj = full_proj[:, :k].contiguous()
        rk.t_basis = c.t_basis[:, :k]
        t_sq = (c.t_proj.double() ** 2).sum(1)
        rk.t_proj_T = c.t_proj.T.contiguous()
        rk.t_keep = 1 - (3 * k + 8) * 2.0 ** -24
        rk.t_lower = (rk.t_keep * t_sq - 1e-6 * t_sq.mean()).float()
        xs, margins, ok = [], [], 0
        for i in range(40):
            y = states[i, :1].float()
            t = time.perf_counter(); g, rel, b = rk.position0(y); xs.append(time.perf_counter() - t)
            ok += int(g[0] == ids[i, 0])
            m = b[0].clone(); m[g[0]] = float('inf'); margins.append(float(m.min()))
        print(f"layer {layer} k {k}: {statistics.median(xs)*1e3:.2f} ms, right {ok}/40, margin median {statistics.median(margins):.3f} min {min(margins):.3f}")
    c.t_proj = full_proj
