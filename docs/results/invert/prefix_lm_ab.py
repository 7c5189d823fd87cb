"""A/B of where a search's LM ranking comes from (Learned._prefix_lm): the blocks above the tap on the observed states
of the prefix (now) against the prefix's ids through the whole model (before), alternating in one process
(common.alternate); the same tokens either way (the two give the same log-probs), every inversion exact.

    python prefix_lm_ab.py LAYER SEED LENGTH [PER_SOURCE] [REPEATS] [B]      e.g. 22 197 20 10 2 32"""
import math
import sys

from common import alternate
from sipit.invert.learned.policy import Learned


def from_ids(self, ids):
    """Learned._prefix_lm before 63fd8aa: the prefix's ids through the whole model."""
    logp = self.tap.lm.next_token_logprobs(ids)
    if logp is None:
        return None
    self.cost["forward_tokens"] += len(ids)
    self.cost["tap_calls"] += 1
    if len(ids) > 1 and float(logp[:-1].gather(1, ids[1:, None].to(logp.device)).mean()) <= -math.log(self.V):
        return None
    return logp[-1].to(self.target.device)


def use(prefix_lm):
    def apply(engine):
        Learned._prefix_lm = prefix_lm
    return apply


layer, seed, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
alternate(layer, seed, length, {"ids (before)": use(from_ids), "states (now)": use(Learned._prefix_lm)},
          *[int(x) for x in sys.argv[4:]])
