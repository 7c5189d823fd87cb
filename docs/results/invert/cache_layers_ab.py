"""KV caches holding only the layers a tap's blocks write (LM.new_cache(blocks), since 9579b4d;
SmolLM2 layer 1: 1 of 30, and every cache helper copies each layer) against all of them, alternating in one process
(common.alternate).

    python cache_layers_ab.py LAYER SEED LENGTH [PER_SOURCE] [REPEATS] [B]      e.g. 1 199 20 10 2"""
import sys

from common import alternate


def layers(short: bool):
    def apply(engine):
        lm = engine.lm
        lm.__dict__.pop("new_cache", None)  # (the method: the tap's layers)
        if not short:
            whole = lm.new_cache
            lm.new_cache = lambda blocks=None: whole()
    return apply


layer, seed, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
alternate(layer, seed, length, {"all layers": layers(False), "the tap's layers": layers(True)},
          *[int(x) for x in sys.argv[4:]])
