"""`sipit identify` on held-out prompts: is every (layer, final norm) of a real model told from the first positions?

    python identify_check.py MODEL SEED [LAYERS]     # e.g. smollm2 1093; LAYERS "0,7,14" (default every 3rd, L-1, L)

Prompts of 20 tokens from prose, code, chat and random ids (sampled with SEED; the screens are fitted on the
`tech` corpus, never read here), captured by one ordinary batched forward (sipit.capture), stored as float32
or bfloat16. Files: each source's first prompt alone (4 one-prompt files) and the four together. Each file is
identified against every (layer, final norm) of MODEL: the outcome is `exact` (the truth is the one match),
`ambiguous` (the truth among several matches), `none` (nothing matched) or `wrong` (another hypothesis the one
match). Prints one JSON line per file and a summary."""
import json
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter

import torch

from sipit.capture import capture
from sipit.corpora import sample
from sipit.identify import Screens, identify
from sipit.models import load_model

torch.set_num_threads(2)
model, seed = sys.argv[1], int(sys.argv[2])
lm = load_model(model)
L = lm.n_layers
layers = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else sorted({*range(0, L + 1, 3), L - 1, L})
sources = ["prose", "code", "chat", "random"]
prompts = {s: sample(f"{s}:1", lm.tokenizer, 20, seed=seed, vocab_size=lm.vocab_size)[0].ids for s in sources}
files = {s: [prompts[s]] for s in sources} | {"all four": list(prompts.values())}
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps(dict(model=model, seed=seed, commit=commit, layers=layers, threads=torch.get_num_threads(),
                      cpu=platform.processor() or platform.machine(),
                      first_tokens={s: lm.decode(p[:1]) for s, p in prompts.items()})), flush=True)
screens = Screens.fit(lm)
print(json.dumps(dict(screens_seconds=round(screens.seconds, 1))), flush=True)
outcomes, seconds = Counter(), []
for layer in layers:
    for final_norm in (False, True):
        states = {name: capture(lm, ids, layer, final_norm) for name, ids in files.items()}
        for dtype in (torch.float32, torch.bfloat16):
            for name, st in states.items():
                first = torch.stack([s[0] for s in st]).to(dtype)
                ident = identify(lm, first, screens=screens)
                truth = [h for h in ident.matching if (h.layer, h.final_norm) == (layer, final_norm)]
                outcome = ("exact" if ident.best else "ambiguous") if truth else ("wrong" if ident.matching else "none")
                outcomes[outcome] += 1
                seconds.append(ident.seconds)
                runner = next(h for h in ident.hypotheses if h not in ident.matching)
                print(json.dumps(dict(layer=layer, final_norm=final_norm, dtype=str(dtype)[6:], file=name,
                                      outcome=outcome, matching=[h.name for h in ident.matching],
                                      matched=ident.hypotheses[0].matched, prompts=ident.prompts,
                                      distance=ident.hypotheses[0].distance, runner_up=runner.name,
                                      runner_up_distance=runner.distance, tolerance=ident.tolerance,
                                      shortlist=ident.shortlist, seconds=round(ident.seconds, 2))), flush=True)
print(json.dumps(dict(summary=dict(outcomes), files=sum(outcomes.values()),
                      median_seconds=round(statistics.median(seconds), 2), max_seconds=round(max(seconds), 2),
                      screens_seconds=round(screens.seconds, 1))), flush=True)
