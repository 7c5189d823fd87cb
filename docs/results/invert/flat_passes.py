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
import sys

import torch

from common import alternate, median_ms
from sipit.models import LayerTap, load_model
from sipit.models.tap import FLAT_KEYS, attention_shape, pack, pass_costs

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


def invert_ab(layer, seed, length, per_source=2, repeats=2, B=1):
    def costs(copies):  # pack's costs with the copies of a padded pass counted or not
        return lambda engine: setattr(engine.tap, "_costs", (pass_costs(engine.lm)[0], pass_costs(engine.lm)[1] * copies))
    alternate(layer, seed, length, {"before (copies uncounted)": costs(0), "now": costs(1)}, per_source, repeats, B)


if sys.argv[1] == "passes":
    passes(sys.argv[2], [int(x) for x in sys.argv[3].split(",")], [int(x) for x in sys.argv[4].split(",")])
else:
    invert_ab(*[int(x) for x in sys.argv[2:]])
