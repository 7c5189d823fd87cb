"""Deep searches drafted in bfloat16 (SipIt.drafts, since this script) against not, alternating in one process
(common.alternate).

    python draft_ab.py LAYER SEED LENGTH [PER_SOURCE] [REPEATS] [B]      e.g. 30 251 20 10 1"""
import sys

from common import alternate


def drafts(on: bool):
    def apply(engine):
        engine.drafts = on
    return apply


layer, seed, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
alternate(layer, seed, length, {"float32 only": drafts(False), "drafted": drafts(True)}, *[int(x) for x in sys.argv[4:]])
