"""One prompt's candidates after a long prefix: padded (each row its own copy of the prefix's cache) or flat (the
prefix once, every candidate in one row: LayerTap._extend_flat), as models/tap.py's `pack` now chooses by cost.

    python flat_passes.py passes MODEL LAYERS PREFIXES      e.g. smollm2 1,15,30 200,600
        one pass of 32 / 128 / 256 one-token candidates after a random prefix, each layout (medians of 5), and
        the copy's cost it implies per (row, cached position) in tokens and in COPY's units (× the keys' and
        values' width ÷ block parameters); a token's cost from flat passes of 16 and 128 rows after 8 tokens.
    python flat_passes.py invert LAYER SEED LENGTH [PER_SOURCE] [REPEATS] [B]      e.g. 15 89 200 2 2
        the bench prompts of a seed at a length, inverted with copies uncounted (as before: padded, whatever the
        prefix) and counted (now) in turn, alternating in one process, every inversion exact; per setting the
        median ratio to the forward, tokens and passes a prompt, seconds in passes. B > 1: lock-step batches of B,
        the ratio to their batched forward. Another model: MODEL=gemma3-270m CAL=fast."""
import os
import statistics
import sys
import time

import torch

from common import SOURCES, median_ms
from sipit.models import LayerTap, load_model
from sipit.models.tap import FLAT_KEYS, attention_shape, pack

torch.set_num_threads(2)


def warm_median_ms(f):
    f()  # (the first call allocates)
    return median_ms(f, 5)


def passes(model, layers, prefixes):
    lm = load_model(model)
    g = torch.Generator().manual_seed(0)
    _, kv_heads, head_dim = attention_shape(lm)
    units = sum(p.numel() for p in lm.blocks[0].parameters()) / (2 * kv_heads * head_dim)
    for layer in layers:
        tap = LayerTap(lm, layer)
        short = tap.prefill(torch.randint(0, lm.vocab_size, (8,), generator=g))
        rows = {n: torch.randint(0, lm.vocab_size, (n, 1), generator=g) for n in (16, 128)}
        token = (warm_median_ms(lambda: tap.extend(short, rows[128], layout="flat"))
                 - warm_median_ms(lambda: tap.extend(short, rows[16], layout="flat"))) / 112
        for P in prefixes:
            prefix = tap.prefill(torch.randint(0, lm.vocab_size, (P,), generator=g))
            for n in (32, 128, 256):
                cand = torch.randint(0, lm.vocab_size, (n, 1), generator=g)
                padded = warm_median_ms(lambda: tap.extend(prefix, cand, keep=True, layout="padded"))
                flat = warm_median_ms(lambda: tap.extend(prefix, cand, keep=True, layout="flat"))
                chosen = "flat" if pack([(P, n, 1)], FLAT_KEYS, *tap._costs)[0][1] else "padded"
                copy = (padded - flat) / token / (n * P)
                print(f"{model} layer {layer}, {P} cached, {n} rows: padded {padded:.1f} ms, flat {flat:.1f} ms "
                      f"({padded / flat:.2f}x; pack picks {chosen}); a token {token:.3f} ms; copy {copy:.4f} tokens = {copy * units:.0f} "
                      f"in COPY's units", flush=True)


def invert_ab(layer, seed, length, per_source, repeats, B):
    from sipit.bench.invert import _forward_seconds, interleaved, prompts
    from sipit.invert import InvertConfig, SipIt
    from sipit.invert.eps import tolerance_for
    from sipit.invert.learned.config import calibration_config

    lm = load_model(os.environ.get("MODEL", "smollm2"))
    tap = LayerTap(lm, layer)
    data = prompts(lm, SOURCES, per_source, length, seed)
    ids = torch.tensor([p for _, p in data])
    states = tap.states(ids)
    engine = SipIt(lm, layer, InvertConfig(learned=calibration_config(os.environ.get("CAL", "full"))),
                   eps=tolerance_for(tap, {states.dtype}).eps)
    engine.invert_prompt(states[0])  # warm-up
    attention, copy = engine.tap._costs
    settings = {"before (copies uncounted)": (attention, 0.0), "now": (attention, copy)}
    ratios, tokens, calls, in_passes = ({s: [] for s in settings} for _ in range(4))
    order = interleaved(data)
    for _ in range(repeats):
        for g in [order[i:i + B] for i in range(0, len(order), B)]:
            fwd = _forward_seconds(tap, ids[g])
            for name, costs in settings.items():
                engine.tap._costs = costs
                t = time.perf_counter()
                rs = engine.invert_prompts([states[i] for i in g], [ids[i].tolist() for i in g])
                assert all(r.exact and r.status == "ok" for r in rs), name
                ratios[name].append((time.perf_counter() - t) / fwd)
                tokens[name].append(sum(r.forward_tokens for r in rs) / len(g))
                calls[name].append(max(r.tap_calls for r in rs))
                in_passes[name].append(sum(r.pass_seconds for r in rs) / len(g))
    for name in settings:
        print(f"{os.environ.get('MODEL', 'smollm2')} layer {layer} seed {seed} length {length} B {B}, {name}: median "
              f"ratio {statistics.median(ratios[name]):.2f} (mean {statistics.mean(ratios[name]):.2f}), tokens "
              f"{statistics.mean(tokens[name]):.0f}, passes {statistics.mean(calls[name]):.1f} a prompt, "
              f"{statistics.mean(in_passes[name]):.3f} s in passes", flush=True)


if sys.argv[1] == "passes":
    passes(sys.argv[2], [int(x) for x in sys.argv[3].split(",")], [int(x) for x in sys.argv[4].split(",")])
else:
    a = [int(x) for x in sys.argv[2:]]
    invert_ab(a[0], a[1], a[2], *(a[3:] + [2, 2, 1][len(a) - 3:]))
