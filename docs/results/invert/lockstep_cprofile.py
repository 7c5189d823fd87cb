"""Where a lock-step batch's time goes, by Python function (cProfile, cumulative): B bench prompts of a seed inverted
together once to warm up, then three times under the profiler; the 45 functions of most cumulative time. The tap's
extend_many is the shared passes; begin_many, settle_many and the loop's steps (_steps, _search) the rest.

    python lockstep_cprofile.py LAYER B SEED        e.g. 15 32 5"""
import cProfile
import pstats
import sys

from common import lockstep_engine

layer, B, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tap, ids, states, engine = lockstep_engine(layer, B, seed)
pr = cProfile.Profile()
pr.enable()
for _ in range(3):
    engine.invert_prompts(list(states))
pr.disable()
pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
