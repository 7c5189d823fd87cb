"""How often a revision's top-1 within the shortlist (LinearRanker.revised, which drives the loop here) is the top-1 of
re-ranking the whole vocabulary (before 5c66bdf), and how often each is the true token, over every revision of the bench
prompts of a seed inverted one at a time.

    python revision_agreement.py LAYER SEED        e.g. 30 773"""
import sys

import torch

import common
from revision_ab import whole_vocabulary

from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

layer, seed = int(sys.argv[1]), int(sys.argv[2])
lm = common.smollm2()
tap = LayerTap(lm, layer)
data, ids, states = common.bench_prompts(lm, tap, seed)
engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
               eps=tolerance_for(tap, {states[0].dtype}).eps)
ranker = engine.policy.ranker
shortlist = ranker.revised
count = dict(positions=0, same=0, shortlist_right=0, whole_right=0)
truth = None  # the prompt being inverted (its true ids)


def revised(items):
    out = shortlist(items)
    for (target, t, guessed, *_), short, whole in zip(items, out, whole_vocabulary(ranker, items)):
        right = truth[t:t + len(guessed)]
        count["positions"] += len(guessed)
        count["same"] += int((short == whole).sum())
        count["shortlist_right"] += int((short == right).sum())
        count["whole_right"] += int((whole == right).sum())
    return out


ranker.revised = revised
for i, s in enumerate(states):
    truth = ids[i]
    r = engine.invert_prompt(s, ids[i].tolist())
    assert r.exact and r.status == "ok", (i, r.status, r.message, r.ids, ids[i].tolist())
print(f"SmolLM2 layer {layer}, the 40 bench prompts of seed {seed}: {count}")
