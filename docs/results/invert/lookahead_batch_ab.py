"""A/B of the lookahead pass's batch (sipit.LOOKAHEAD_BATCH, SipIt._widen): after a wrong guess, the search's first pass
holds the candidates that carry the guessed continuation and, widened, the next best alone up to 16. Settings: `off`
(the carrying ones only, as before 76d3bb5), `always` (widened for every prompt alone, 76d3bb5), `adaptive` (widened
where the carrying candidates have been wrong in a third of the engine's lookaheads or more: the default), `batch4`,
`batch8` (widened in a lock-step batch too, to 4 or 8 candidates: never widened there since 6ff68da). The same
held-out bench prompts, the settings alternating in one process (common.alternate: every inversion exact and `ok`),
per setting the median ratio to the forward, tokens and passes a prompt.

    python lookahead_batch_ab.py LAYER SEED PROMPTS_PER_SOURCE REPEATS B SETTINGS      e.g. 30 523 5 1 1 off,adaptive"""
import importlib
import sys

from common import alternate

S = importlib.import_module("sipit.invert.sipit")
layer, seed, n, reps, B = (int(a) for a in sys.argv[1:6])
adaptive = S.SipIt._widen


def setting(name):
    def apply(engine):
        S.LOOKAHEAD_BATCH = 0 if name == "off" else int(name[5:]) if name.startswith("batch") else 16
        S.SipIt._widen = adaptive if name == "adaptive" else (lambda self, run: name.startswith("batch") or
                                                              not run.in_batch)
    return apply


alternate(layer, seed, 20, {name: setting(name) for name in sys.argv[6].split(",")}, per_source=n, repeats=reps, B=B)
