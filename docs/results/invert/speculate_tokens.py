"""How many guessed tokens a speculation or lookahead row should carry (InvertConfig.speculate_tokens): a wrong
guess at t wastes the tokens computed after it, and each one costs the pass that re-verifies the rest (a row
wholly right doubles the next: SipIt._guess). The bench prompts of a seed at a length, inverted with each cap
in turn (alternating, one process), every inversion exact; per cap the median ratio to the forward, tokens
pushed and passes a prompt.
    python speculate_tokens.py LAYER SEED LENGTH CAPS [PER_SOURCE] [REPEATS] [B]    e.g. 15 5 200 0,32 2 2
(cap 0: none, every guess carried; a cap ending in n, e.g. 32n: every prompt's first row capped, whatever the
engine's history says: SipIt._reliable). With B > 1 the prompts go in lock-step batches of B (bench order, the
sources interleaved) and the ratio is to the batch's batched forward. Another model: MODEL=gemma3-270m CAL=fast
(default smollm2, full calibration)."""
import sys

from common import alternate
from sipit.invert import SipIt


def cap(c: str):
    """A setting: rows of at most int(c) guesses (0: none), every first row capped where c ends in n."""
    def apply(engine):
        engine.config.speculate_tokens = int(c.rstrip("n")) or 10**9
        engine._reliable = (lambda T: False) if c.endswith("n") else SipIt._reliable.__get__(engine)
    return apply


layer, seed, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rest = [int(x) for x in sys.argv[5:]]
alternate(layer, seed, length, {f"cap {c}": cap(c) for c in sys.argv[4].split(",")}, *rest)
