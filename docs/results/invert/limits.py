"""Why one prompt at a time stays above 1.5 forwards at layer LAYER on a CPU: what a pass costs, how many
passes the ranker's first guesses leave, and how many a fork (a runner-up verified beside an uncertain
guess in the first pass) could save.

    python limits.py LAYER SEED [PROMPTS_PER_SOURCE]

1. Pass cost: the median of 7 passes of k new tokens on a 10-token prefix (float32, the model's dtype), and
   of the model's bfloat16 copy (a draft model's passes would cost that).
2. The first guesses (LinearRanker.guesses, from the observed states alone; the full calibration without the
   lens prior, lens_rows=0, as this analysis was made before it: lens_ab.py compares) against the truth: wrong
   positions per source, and prompts with none (those are inverted in one pass; each wrong guess costs
   at least one more).
3. Forks: at each position, the runner-ups (2nd..(K+1)th by the exact scores, `scores_many`) within G of
   the best (2 x the log-likelihood ratio): prompts whose every wrong guess has its true token among them
   (one pass if forks were verified in it), and what the forks cost (tokens: each carries the rest of
   the guess).
4. A bfloat16 copy's states of the true prompts against the float32 ones, and of 255 random wrong tokens at
   position 10 of the first 12 prompts (relative distances): how well a draft model would screen."""
import dataclasses
import statistics
import sys
import time

import torch

from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.invert.verify import rel_distance
from sipit.models import LayerTap, load_model

layer, seed = int(sys.argv[1]), int(sys.argv[2])
per_source = int(sys.argv[3]) if len(sys.argv) > 3 else 10
torch.set_num_threads(2)
lm = load_model("smollm2")
sources = ["prose", "code", "random", "chat"]
data = prompts(lm, sources, per_source, 20, seed)
ids = torch.tensor([p for _, p in data])
tap = LayerTap(lm, layer)
states = [s.float() for s in tap.states(ids)]

print(f"1. passes at layer {layer} on a 10-token prefix (median of 7, 2 threads):")
low = lm.copy_in(torch.bfloat16)
for name, model in (("float32", lm), ("bfloat16", low)):
    t_ = LayerTap(model, layer)
    prefix = t_.prefill(ids[0, :10])
    for k in (1, 8, 20):
        seconds = []
        for _ in range(7):
            t = time.perf_counter()
            t_.extend(prefix, ids[0, 10:10 + k][None])
            seconds.append(time.perf_counter() - t)
        print(f"   {name}: {k:2d} tokens {1000 * statistics.median(seconds):5.1f} ms")

plain = dataclasses.replace(calibration_config("full"), lens_rows=0)  # the ranker before the lens prior
ranker = SipIt(lm, layer, InvertConfig(policy="learned", learned=plain)).policy.ranker
guesses = ranker.guesses(states)
K, T = 4, ids.shape[1]
runner_ups, gaps = [], []
for s, (_, prior) in zip(states, guesses):
    best = ranker.scores_many([(s, t, prior, None) for t in range(1, T)]).topk(1 + K)  # [T-1, 1+K]
    runner_ups.append(best.indices[:, 1:])
    gaps.append(best.values[:, :1] - best.values[:, 1:])
wrong = [g != p[1:] for (g, _), p in zip(guesses, ids)]  # [T-1] each
print(f"2. first guesses, seed {seed}: wrong positions per source (of {per_source * (T - 1)}), prompts with none:")
for src in sources:
    mine = [w for w, (kind, _) in zip(wrong, data) if kind == src]
    print(f"   {src}: {sum(int(w.sum()) for w in mine)} wrong, {sum(int(w.sum()) == 0 for w in mine)} of {len(mine)} "
          f"prompts with none")
print(f"3. one-pass prompts (of {len(data)}) if forks within G of the guess were verified in the first pass; "
      "fork tokens a prompt:")
for G in (10, 20, 40, 80):
    for k in (1, 2, 4):
        one_pass, tokens = 0, 0
        for w, r, gap, p in zip(wrong, runner_ups, gaps, ids):
            forked = gap[:, :k] < G  # [T-1, k]
            covered = ((r[:, :k] == p[1:, None]) & forked).any(1)
            one_pass += int((w & ~covered).sum()) == 0
            tokens += int((forked.sum(1) * torch.arange(T - 1, 0, -1)).sum())
        print(f"   G {G:2d}, {k} runner-up(s): {one_pass} one-pass prompts, {tokens / len(data):.1f} fork tokens")

low_tap = LayerTap(low, layer)
d_true = rel_distance(low_tap.states(ids).float().flatten(0, 1), torch.stack(states).flatten(0, 1))
wrong_min = []
for i in range(min(12, len(ids))):
    prefix = low_tap.prefill(ids[i, :10])
    cand = torch.randint(0, lm.vocab_size, (255,), generator=torch.Generator().manual_seed(i))
    cand = cand[cand != ids[i, 10]]
    wrong_min.append(float(rel_distance(low_tap.extend(prefix, cand[:, None])[:, 0].float(), states[i][10]).min()))
print(f"4. bfloat16 states of the true prompts: relative distance median {float(d_true.median()):.3f}, largest "
      f"{float(d_true.max()):.2f}; nearest of 255 random wrong tokens {min(wrong_min):.2f}-{max(wrong_min):.2f}")
