"""Layer-L misses of the first guesses (seed-SEED bench prompts) and how many an oracle prior would fix:
the full LM's next-token log-probs on the true prefix, added with weight w. python prior_oracle.py LAYER SEED"""
import sys, collections, torch
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
layer, seed = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(2)
lm = load_model("smollm2")
data = prompts(lm, ["prose", "code", "random", "chat"], 8, 20, seed)
ids = torch.tensor([p for _, p in data]); tap = LayerTap(lm, layer); states = tap.states(ids)
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")))
pols = eng.policy.begin_many([s for s in states], [dict(forward_tokens=0, backward_tokens=0, tap_calls=0) for _ in states])
R = eng.policy.ranker
with torch.no_grad():
    logits = lm.model(ids).logits.float().log_softmax(-1)  # [N, T, V]
for w in [0, 1, 2, 5, 10]:
    wrong = collections.Counter(); total = collections.Counter()
    for n, ((kind, p), pol, s) in enumerate(zip(data, pols, states)):
        for t in range(1, 20):
            sc = R.scores(s.float(), t, False) + w * logits[n, t - 1]
            total[kind] += 1
            wrong[kind] += int(sc.argmax()) != p[t]
    print("w", w, dict(wrong), "of", dict(total))
