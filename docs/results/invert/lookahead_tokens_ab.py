"""A/B of InvertConfig.lookahead_tokens (how many candidates of a search's first pass carry the guessed continuation:
lookahead_tokens ÷ its length), alternating in one process (common.alternate: every inversion exact and ok).

    python lookahead_tokens_ab.py LAYER SEED PER_SOURCE REPEATS B VALUES        e.g. 30 769 5 1 1 32,80,160"""
import sys
from dataclasses import replace

import common


def setting(value: int):
    def apply(engine):
        engine.config = replace(engine.config, lookahead_tokens=value)
    return apply


layer, seed, per_source, repeats, B = (int(x) for x in sys.argv[1:6])
common.alternate(layer, seed, 20, {f"lookahead_tokens {v}": setting(int(v)) for v in sys.argv[6].split(",")},
                 per_source, repeats, B)
