"""A lock-step batch's rounds under each LOOKAHEAD_BATCH (sipit.py): B bench prompts of a seed (sources interleaved as the
bench takes them) inverted together, per setting the batch's seconds against its batched forward and each round's tokens
and milliseconds (the tap's extend_many timed). At 76d3bb5 lock-step batches widened their lookaheads to LOOKAHEAD_BATCH
too; since 6ff68da they never do, so every setting gives the same rounds (lookahead_batch_ab.txt has both).

    python lookahead_batch_rounds.py LAYER B SEED SIZES        e.g. 15 32 5 16,0"""
import importlib
import sys
import time

from common import lockstep_engine

S = importlib.import_module("sipit.invert.sipit")
layer, B, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tap, ids, states, engine = lockstep_engine(layer, B, seed)
many = engine.tap.extend_many
for lb in [int(x) for x in sys.argv[4].split(",")]:
    S.LOOKAHEAD_BATCH = lb
    rounds = []  # (tokens, ms) per round

    def timed(requests, *args):
        t = time.perf_counter()
        out = list(many(requests, *args))
        rounds.append((sum(r.numel() for _, r in requests), round((time.perf_counter() - t) * 1e3, 1)))
        return iter(out)

    engine.tap.extend_many = timed
    t = time.perf_counter()
    engine.invert_prompts(list(states))
    w = time.perf_counter() - t
    engine.tap.extend_many = many
    t = time.perf_counter()
    tap.states(ids)
    f = time.perf_counter() - t
    print(f"L{layer} B{B} seed {seed} LOOKAHEAD_BATCH {lb}: batch {w * 1e3:.0f} ms, forward {f * 1e3:.0f} ms, ratio "
          f"{w / f:.2f}; rounds (tokens, ms): {rounds}; in passes {sum(ms for _, ms in rounds):.0f} ms")
