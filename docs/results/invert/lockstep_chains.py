"""What each prompt of a lock-step batch asked of each round: B bench prompts of a seed inverted together (after a
warm-up), every round's tokens and milliseconds (the tap's extend_many timed) by kind, and each prompt's chain of
passes that took more than one: S = a speculation row, L = a search's first pass after a wrong guess (the lookahead:
the candidate that carries the guessed continuation), Q = a later search batch, C = certificates; each with its
tokens. The batch takes as many rounds as its longest chain.

    python lockstep_chains.py LAYER B SEED        e.g. 15 32 631"""
import importlib
import sys
import time
from collections import Counter

from common import lockstep_engine

S = importlib.import_module("sipit.invert.sipit")
layer, B, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tap, ids, states, engine = lockstep_engine(layer, B, seed)
kind, chains, pending, rounds = {}, {}, Counter(), []  # kind: id(run) -> what its next pass is


def tagged(method, tag):
    def wrapper(self, run, *args):
        kind[id(run)] = tag(args)
        out = yield from method(self, run, *args)
        kind[id(run)] = "C"  # (what a loop asks outside a speculation or a search: certificates)
        return out
    return wrapper


def extend_many(self, run, requests):
    k = kind.get(id(run), "C")
    if k == "L":
        kind[id(run)] = "Q"  # a search's later batches
    tokens = sum(r.numel() for _, r in requests)
    pending[k] += tokens
    chains.setdefault(id(run), []).append(f"{k}{tokens}")
    return (yield from plain(self, run, requests))


plain = S.SipIt._extend_many
S.SipIt._extend_many = extend_many
S.SipIt._speculate = tagged(S.SipIt._speculate, lambda args: "S")
S.SipIt._search = tagged(S.SipIt._search, lambda args: "L" if args[2] is not None and len(args[2]) else "Q")
many = engine.tap.extend_many


def timed(requests, *args):
    t = time.perf_counter()
    out = list(many(requests, *args))
    rounds.append((dict(pending), round((time.perf_counter() - t) * 1e3, 1)))
    pending.clear()
    return iter(out)


engine.tap.extend_many = timed
t = time.perf_counter()
results = engine.invert_prompts(list(states))
w = time.perf_counter() - t
t = time.perf_counter()
tap.states(ids)
f = time.perf_counter() - t
exact = sum(r.ids == p.tolist() for r, p in zip(results, ids))
print(f"layer {layer} B {B} seed {seed}: batch {w * 1e3:.0f} ms, batched forward {f * 1e3:.0f} ms, ratio {w / f:.2f}, "
      f"{exact} of {B} exact; {len(rounds)} rounds (tokens by kind, ms):")
for r in rounds:
    print("  ", r)
print("chains of more than one pass:")
for c in sorted(chains.values(), key=len):
    if len(c) > 1:
        print("  ", " ".join(c))
