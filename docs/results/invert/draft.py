"""The bfloat16 draft that screens wide search batches (SipIt._screen, InvertConfig.draft).

    python draft.py passes LAYERS BATCHES          e.g. 15,30 64,256
        one pass of B one-token candidates (the true token among them) after 19 random-id tokens, float32 and
        bfloat16 (flat, medians of 5), and the draft's relative distances: the true token's, the nearest wrong.
    python draft.py invert LAYER SEED LENGTH [PER_SOURCE] [REPEATS] [B]     e.g. 30 127 20 5 1
        the bench prompts of a seed at a length, inverted without and with the draft in turn, alternating in
        one process, every inversion exact; per setting the median ratio to the forward, float32 and draft
        tokens a prompt, seconds in passes. B > 1: lock-step batches of B. Another model: MODEL=gemma3-270m CAL=fast."""
import os
import statistics
import sys
import time

import torch

from common import SOURCES, median_ms
from sipit.invert.verify import rel_distance
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
MODEL = os.environ.get("MODEL", "smollm2")


def passes(layers, batches):
    lm = load_model(MODEL)
    draft = lm.draft
    g = torch.Generator().manual_seed(0)
    for layer in layers:
        tap, tap_draft = LayerTap(lm, layer), LayerTap(draft, layer)
        ids = torch.randint(0, lm.vocab_size, (20,), generator=g)
        prefix = tap.prefill(ids[:19])
        ref = tap.states(ids)[19]
        for B in batches:
            cand = torch.randint(0, lm.vocab_size, (B, 1), generator=g)
            cand[3, 0] = ids[19]
            fp32 = median_ms(lambda: tap.extend(prefix, cand, layout="flat"), 5)
            bf16 = median_ms(lambda: tap_draft.extend(prefix.to(torch.bfloat16), cand, layout="flat"), 5)
            d = rel_distance(tap_draft.extend(prefix.to(torch.bfloat16), cand, layout="flat")[:, 0].float(), ref)
            print(f"{MODEL} layer {layer}, {B} candidates: float32 {fp32:.1f} ms, draft {bf16:.1f} ms ({fp32 / bf16:.2f}x); "
                  f"draft distance of the true token {float(d[3]):.3f}, nearest wrong {float(d[torch.arange(B) != 3].min()):.3f}",
                  flush=True)


def invert_ab(layer, seed, length, per_source=2, repeats=2, B=1):
    from sipit.bench.invert import _forward_seconds, interleaved, prompts
    from sipit.invert import InvertConfig, SipIt
    from sipit.invert.eps import tolerance_for
    from sipit.invert.learned.config import calibration_config

    lm = load_model(MODEL)
    tap = LayerTap(lm, layer)
    data = prompts(lm, SOURCES, per_source, length, seed)
    ids = torch.tensor([p for _, p in data])
    states = tap.states(ids)
    engine = SipIt(lm, layer, InvertConfig(learned=calibration_config(os.environ.get("CAL", "full")), draft=True),
                   eps=tolerance_for(tap, {states.dtype}).eps)
    engine.invert_prompt(states[0])  # warm-up
    settings = {"without the draft": None, "with it": engine.draft}
    ratios, tokens, drafted, in_passes = ({s: [] for s in settings} for _ in range(4))
    order = interleaved(data)
    for _ in range(repeats):
        for g in [order[i:i + B] for i in range(0, len(order), B)]:
            fwd = _forward_seconds(tap, ids[g])
            for name, draft in settings.items():
                engine.draft = draft
                t = time.perf_counter()
                rs = engine.invert_prompts([states[i] for i in g], [ids[i].tolist() for i in g])
                assert all(r.exact and r.status == "ok" for r in rs), name
                ratios[name].append((time.perf_counter() - t) / fwd)
                tokens[name].append(sum(r.forward_tokens for r in rs) / len(g))
                drafted[name].append(sum(r.draft_tokens for r in rs) / len(g))
                in_passes[name].append(sum(r.pass_seconds for r in rs) / len(g))
    for name in settings:
        print(f"{MODEL} layer {layer} seed {seed} length {length} B {B}, {name}: median ratio "
              f"{statistics.median(ratios[name]):.2f} (mean {statistics.mean(ratios[name]):.2f}), float32 tokens "
              f"{statistics.mean(tokens[name]):.0f}, draft tokens {statistics.mean(drafted[name]):.0f} a prompt, "
              f"{statistics.mean(in_passes[name]):.3f} s in passes", flush=True)


if sys.argv[1] == "passes":
    passes([int(x) for x in sys.argv[2].split(",")], [int(x) for x in sys.argv[3].split(",")])
else:
    invert_ab(*[int(x) for x in sys.argv[2:]])
