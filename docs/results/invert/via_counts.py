"""How each position of the bench prompts of some seeds was verified (Position.via: speculation, lookahead, search,
full-length), inverted one at a time, every prompt exact and ok.

    python via_counts.py LAYER SEEDS        e.g. 30 809,811,821"""
import collections
import sys

import common

from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap

layer = int(sys.argv[1])
lm = common.smollm2()
tap = LayerTap(lm, layer)
for seed in [int(s) for s in sys.argv[2].split(",")]:
    data, ids, states = common.bench_prompts(lm, tap, seed)
    engine = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")),
                   eps=tolerance_for(tap, {states[0].dtype}).eps)
    count = collections.Counter()
    for i, s in enumerate(states):
        r = engine.invert_prompt(s, ids[i].tolist())
        assert r.exact and r.status == "ok", (seed, i, r.message)
        count.update(q.via for q in r.positions)
    print(f"SmolLM2 layer {layer}, seed {seed}: {dict(count)}", flush=True)
