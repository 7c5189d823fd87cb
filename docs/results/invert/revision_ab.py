"""A/B: a revision's re-ranking over the whole vocabulary (before 2026-11-27's change) against within the shortlist the
first guesses were picked from (LinearRanker.revised now), alternating in one process on the bench prompts of a seed
(common.alternate: every inversion exact and ok).

    python revision_ab.py LAYER SEED PER_SOURCE REPEATS B        e.g. 30 787 10 1 1"""
import functools
import sys
import types

import common
from sipit.invert.learned.ranker import LinearRanker

BEFORE = "15031eb"  # the last commit whose revisions re-ranked the whole vocabulary


@functools.cache
def _before():
    return common.module_before(BEFORE, "ranker").LinearRanker.revised


def whole_vocabulary(self, items):
    """The revision before: each position's top-1 over the whole vocabulary (screen, or screen_prior), the current
    ranker read through BEFORE's LinearRanker.revised (which takes no shortlist)."""
    return _before()(self, [item[:5] for item in items])


def setting(method):
    def apply(engine):
        ranker = engine.policy.ranker
        ranker.revised = types.MethodType(method, ranker)
    return apply


if __name__ == "__main__":
    layer, seed, per_source, repeats, B = (int(x) for x in sys.argv[1:6])
    common.alternate(layer, seed, 20, {"whole vocabulary": setting(whole_vocabulary),
                                       "shortlist": setting(LinearRanker.revised)}, per_source, repeats, B)
