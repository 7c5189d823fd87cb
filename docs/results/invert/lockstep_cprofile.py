"""Where a lock-step batch's time goes, by Python function (cProfile, cumulative): B bench prompts of a seed inverted
together once to warm up, then three times under the profiler; the 45 functions of most cumulative time. The tap's
extend_many is the shared passes; begin_many, settle_many and the loop's steps (_steps, _search) the rest.

    python lockstep_cprofile.py LAYER B SEED        e.g. 15 32 5"""
import cProfile
import pstats
import sys

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer, B, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
lm = load_model("smollm2")
tap = LayerTap(lm, layer)
ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)])[:B]
states = tap.states(ids)
engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
               eps=tolerance_for(tap, {states.dtype}).eps)
engine.invert_prompts(list(states))
pr = cProfile.Profile()
pr.enable()
for _ in range(3):
    engine.invert_prompts(list(states))
pr.disable()
pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
