"""A lock-step batch of 32 bench prompts (the first 32 taken one of each source in turn, as `sipit bench` batches
them), its passes traced: per round the requests, new tokens, longest prefix and milliseconds, then the time
outside the passes; three repeats, every prompt exact. Then the last repeat's tokens by kind: rows that carry
guessed continuations (speculation, a lookahead's best candidate) and one-token candidate rows (the rest of a
lookahead, search batches), by rows a request; and how many candidates the positions not found by the first
speculation tried.

    python lockstep_rounds.py LAYER SEED        e.g. 15 5"""
import sys, time, statistics, torch
from collections import Counter
from sipit.bench.invert import interleaved, prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
layer, seed = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(2)
lm = load_model("smollm2")
data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
ids = torch.tensor([data[i][1] for i in interleaved(data)[:32]])
tap = LayerTap(lm, layer)
states = tap.states(ids)
eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=tolerance_for(tap, {states.dtype}).eps)
eng.invert_prompts(list(states[:4]))
log, kinds = [], Counter()  # kinds: (k > 1 ? "continuation rows" : "one-token rows", rows a request) -> tokens
orig = eng.tap.extend_many
def traced(requests, max_tokens=1024):
    t = time.perf_counter(); out = orig(requests, max_tokens); dt = time.perf_counter() - t
    log.append((len(requests), sum(r.numel() for _, r in requests), max(p.length for p, _ in requests), dt))
    for _, r in requests:
        kinds["continuation rows" if r.shape[1] > 1 else "one-token rows", r.shape[0]] += r.numel()
    return out
eng.tap.extend_many = traced
for rep in range(3):
    t = time.perf_counter(); tap.states(ids); fwd = time.perf_counter() - t
    log.clear(); kinds.clear()
    t = time.perf_counter(); res = eng.invert_prompts(list(states)); tot = time.perf_counter() - t
    assert all(r.ids == p.tolist() for r, p in zip(res, ids))
    inpass = sum(x[3] for x in log)
    print(f"rep {rep}: forward {fwd*1e3:.0f} ms, inversion {tot*1e3:.0f} ms (ratio {tot/fwd:.2f}), passes {inpass*1e3:.0f} ms, outside {(tot-inpass)*1e3:.0f} ms")
    for x in log: print(f"   requests {x[0]:3d} tokens {x[1]:4d} longest prefix {x[2]:2d}: {x[3]*1e3:6.1f} ms")
    wrong = sum(1 for r in res for q in r.positions if q.via != 'speculation')
    print("   positions not by first speculation:", wrong, "tap_calls", sum(r.tap_calls for r in res))
total = sum(kinds.values())
for kind in ("continuation rows", "one-token rows"):
    part = {n: v for (k, n), v in kinds.items() if k == kind}
    print(f"{kind}: {sum(part.values())} of {total} tokens; by rows a request: "
          + ", ".join(f"{n}: {v}" for n, v in sorted(part.items(), key=lambda x: -x[1])[:8]))
tried = Counter((q.via, q.tried) for r in res for q in r.positions if q.via != "speculation")
print("positions not by first speculation, (via, candidates tried): count:",
      ", ".join(f"{v} {n}: {c}" for (v, n), c in sorted(tried.items())))
