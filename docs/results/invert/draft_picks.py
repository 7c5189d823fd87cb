"""Could one pass of alternatives fix many wrong guesses at once? The guessed row of each bench prompt plus, at every
position t ≥ 1, the ranker's next K candidates there, each as one token that sees the guessed row before t (one pass
of T + (T−1)·K tokens, a tree mask); at each position the candidate whose state lies nearest the observation is
picked, the row replaced by the picks, and the pass repeated. Counts the wrong picks where every guess before t was
right (the truth is then picked whenever it is among the K + 1) and where some was not (the candidates saw a wrong
token), and the prompts whose row is then wholly right. The tokens are exact in neither case: a pick is still a
guess that a float32 pass must verify. DTYPE fp32 or bf16 (the pass through a bfloat16 copy: a draft).

    python draft_picks.py LAYER SEED K ROUNDS DTYPE        e.g. 30 599 8 3 fp32"""
import sys
import time

import torch

from common import bench_prompts, smollm2
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.invert.verify import rel_distance
from sipit.models import LayerTap

layer, seed, K, rounds, dtype = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lm = smollm2()
tap = LayerTap(lm, layer)
policy = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full"))).policy
rk = policy.ranker
data, ids, states = bench_prompts(lm, tap, seed)
draft = LayerTap(lm.copy_in(torch.bfloat16), layer) if dtype == "bf16" else tap


def ranked(target: torch.Tensor, prior: bool, m: int = 64) -> torch.Tensor:
    """The ranker's best m at positions 1.. of a prompt (target [T, d]), best first, by its scores of the whole
    vocabulary (LinearRanker.scores_many; with the LM prior where the prompt's guesses use it): [T-1, m]."""
    scores = rk.scores_many([(target, t, prior, None) for t in range(1, len(target))])  # [T-1, V]
    return scores.topk(m, dim=1).indices


def tree_pass(row: torch.Tensor, alts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """row [T] and alternatives [T-1, K] (those of position t see row[:t] and themselves) in one pass:
    states [T, d] of the row and [T-1, K, d] of the alternatives."""
    T, k = len(row), alts.shape[1]
    tokens = torch.cat([row, alts.flatten()])
    pos = torch.cat([torch.arange(T), torch.arange(1, T).repeat_interleave(k)])
    N = len(tokens)
    see = torch.zeros(N, N, dtype=torch.bool)
    see[:T, :T] = torch.ones(T, T, dtype=torch.bool).tril()
    see[T:, :T] = torch.arange(T)[None, :] < pos[T:, None]
    see[T:, T:] = torch.eye(N - T, dtype=torch.bool)
    mask = torch.zeros(1, 1, N, N, dtype=draft.lm.dtype).masked_fill_(~see, torch.finfo(draft.lm.dtype).min)
    h = draft._run(ids=tokens[None], position_ids=pos[None], attention_mask=mask,
                   cache=draft.lm.new_cache(draft.blocks_read))[0].float()
    return h[:T], h[T:].view(T - 1, k, -1)


costs = [dict(forward_tokens=0, backward_tokens=0, tap_calls=0, pass_seconds=0.0) for _ in states]
begun = policy.begin_many(states, costs)  # the first guesses, as the loop gets them
first_wrong = in_reach = positions = 0
wrong_in, n_in, wrong_off, n_off = ([0] * rounds for _ in range(4))
right_rows, seconds = [0] * (rounds + 1), 0.0
for truth, target, p in zip(ids, states, begun):
    row = p.guess.clone()
    row[0] = truth[0]  # (position 0 from the table: exact)
    cands = ranked(target, p.prior)
    positions += len(truth) - 1
    first_wrong += int((row[1:] != truth[1:]).sum())
    right_rows[0] += bool((row == truth).all())
    for k in range(rounds):
        alts = torch.stack([c[c != g][:K] for c, g in zip(cands, row[1:])])  # [T-1, K]
        if k == 0:
            in_reach += int(((alts == truth[1:, None]).any(1) | (row[1:] == truth[1:])).sum())
        t0 = time.perf_counter()
        hr, ha = tree_pass(row, alts)
        seconds += time.perf_counter() - t0
        d = torch.cat([rel_distance(hr[1:], target[1:])[:, None], rel_distance(ha, target[1:, None])], 1)
        pick = torch.cat([row[1:, None], alts], 1).gather(1, d.argmin(1, keepdim=True))[:, 0]
        context_right = (row[:-1] == truth[:-1]).long().cumprod(0).bool()  # [T-1]: every guess before t right
        wrong = pick != truth[1:]
        wrong_in[k] += int((wrong & context_right).sum())
        n_in[k] += int(context_right.sum())
        wrong_off[k] += int((wrong & ~context_right).sum())
        n_off[k] += int((~context_right).sum())
        row = torch.cat([row[:1], pick])
        right_rows[k + 1] += bool((row == truth).all())
print(f"layer {layer} seed {seed} K {K} {dtype}: {positions} positions, first guesses wrong at {first_wrong}, the truth "
      f"among the guess and its K next at {in_reach}; a pass of {len(ids[0]) + (len(ids[0]) - 1) * K} tokens "
      f"{seconds / len(ids) / rounds * 1e3:.0f} ms; prompts with every first guess right {right_rows[0]} of {len(ids)}")
for k in range(rounds):
    print(f"  round {k + 1}: wrong picks {wrong_in[k]} of {n_in[k]} positions after a right row, {wrong_off[k]} of "
          f"{n_off[k]} after a wrong one; rows wholly right {right_rows[k + 1]} of {len(ids)}")
