"""A/B of the lookahead pass's batch (sipit.LOOKAHEAD_BATCH): after a wrong guess, the search's first pass holds the
candidates that carry the guessed continuation and, with LOOKAHEAD_BATCH = 16, the next best alone up to 16; 0: the
carrying ones only (before). The same held-out bench prompts, the settings alternating in one process (common.alternate:
every inversion exact and `ok`), per setting the median ratio to the forward, tokens and passes a prompt.

    python lookahead_batch_ab.py LAYER SEED PROMPTS_PER_SOURCE REPEATS B SIZES      e.g. 30 523 5 1 1 0,16"""
import importlib
import sys

from common import alternate

S = importlib.import_module("sipit.invert.sipit")
layer, seed, n, reps, B = (int(a) for a in sys.argv[1:6])
settings = {f"LOOKAHEAD_BATCH {a}": (lambda e, a=a: setattr(S, "LOOKAHEAD_BATCH", a))
            for a in (int(x) for x in sys.argv[6].split(","))}
alternate(layer, seed, 20, settings, per_source=n, repeats=reps, B=B)
