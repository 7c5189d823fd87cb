"""Tried, not kept: a top-k by block maxima (the k best blocks of 64 columns by their maxima hold the top k; 5e97427's
ranker.top_k) for the screens and position 0, against torch's top-k, alternating in one process (common.alternate).

    python topk_ab.py LAYER SEED LENGTH [PER_SOURCE] [REPEATS] [B]      e.g. 1 167 20 10 2
(MODEL=gemma3-270m CAL=fast for Gemma-3.) 5e97427's ranker.py is read with `git show` and its top_k swapped: "block"
(as 5e97427), "float_only" (block maxima for float32 scores only: position 0) and "plain" (torch's top-k, as now)."""
import subprocess
import sys
import types

from common import alternate

source = subprocess.check_output(["git", "show", "5e97427:src/sipit/invert/learned/ranker.py"], text=True)
R = types.ModuleType("sipit.invert.learned.ranker_5e97427")
R.__package__ = "sipit.invert.learned"
exec(compile(source, "ranker.py@5e97427", "exec"), R.__dict__)
block = R.top_k


def top_k(f):
    def apply(engine):
        now = engine.policy.ranker
        if not isinstance(now, R.LinearRanker):  # (the same calibration, 5e97427's ranker)
            engine.policy.ranker = R.LinearRanker(now.cal, engine.tap, now.screen_top, guess_top=now.guess_top)
        R.top_k = f
    return apply


layer, seed, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
alternate(layer, seed, length, {
    "block": top_k(block),
    "float_only": top_k(lambda x, k, largest=True: block(x, k, largest) if x.dtype.is_floating_point and x.dtype.itemsize == 4
                        else x.topk(k, dim=1, largest=largest).indices),
    "plain": top_k(lambda x, k, largest=True: x.topk(k, dim=1, largest=largest).indices)}, *[int(x) for x in sys.argv[4:]])
