"""A pass's grown prefixes copying their KV cache out of the pass's only when extended (tap.Prefix.make, since this
script) against at once, as before, alternating in one process (common.alternate). Most grown prefixes are never
extended: a prompt's last pass, a search's lookahead that verified the rest.

    python lazy_prefix_ab.py LAYER SEED LENGTH [PER_SOURCE] [REPEATS] [B]      e.g. 15 229 20 10 2 32"""
import sys

from common import alternate


def prefixes(lazy: bool):
    def apply(engine):
        tap = engine.tap
        tap.__dict__.pop("extend_many", None)  # (the method: lazy)
        if not lazy:
            extend_many = tap.extend_many

            def eager(*args, **kwargs):
                def copied(grown):
                    def at_once(b, n):
                        prefix = grown(b, n)
                        prefix.cache  # (copies it now)
                        return prefix
                    return at_once
                return [(states, copied(grown)) for states, grown in extend_many(*args, **kwargs)]
            tap.extend_many = eager
    return apply


layer, seed, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
alternate(layer, seed, length, {"at once": prefixes(False), "lazy": prefixes(True)}, *[int(x) for x in sys.argv[4:]])
