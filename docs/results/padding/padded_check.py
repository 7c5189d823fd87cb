"""`sipit invert` on transformers' states of padded batches, as a user captures them: are the prompts exact?

    python padded_check.py MODEL SEED LAYERS [CALIBRATION [UNMASKED]]   # e.g. smollm2 1151 1,15,30 full yes

16 held-out prompts (prose, code, chat and random ids, 4 each, sampled with SEED; each cut to a length drawn from
4..40 tokens) in one batch, padded left and right with the tokenizer's pad id (else its eos), through one plain
forward `model(input_ids, attention_mask, output_hidden_states=True)` (no position_ids: what a user's call gives).
Saved as torch.save({"hidden_states": the tuple, "attention_mask", "input_ids"}) and inverted by `sipit invert FILE
--model MODEL --layer L`, which reads each row where its mask is 1 and checks it against its input_ids. Also each
side's tuple alone, without its mask, at every layer (UNMASKED yes, the default): from e996b31 each row opening with
a run of the left padding's one state is inverted after it (`padded` rows; before it every padded row failed at
position 0, after every token was tried there where the calibration has no position-0 table); from the commit after
39ab9d2 a right-padded row's search finds where its padding begins (`padded` rows; before it each padded row failed
at its first pad, after every token was tried there). Prints one JSON line per (side, layer, mask) and the
machine."""
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sipit.cli import main
from sipit.corpora import sample
from sipit.models import load_model

torch.set_num_threads(2)
model, seed = sys.argv[1], int(sys.argv[2])
layers = [int(x) for x in sys.argv[3].split(",")]
calibration = sys.argv[4] if len(sys.argv) > 4 else "full"
unmasked = (sys.argv[5] if len(sys.argv) > 5 else "yes") == "yes"
lm = load_model(model)
rng = random.Random(seed)
prompts = [p.ids[:rng.randint(4, 40)] for s in ("prose", "code", "chat", "random")
           for p in sample(f"{s}:4", lm.tokenizer, 40, seed=seed, vocab_size=lm.vocab_size)]
pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.tokenizer.eos_token_id
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps(dict(model=model, seed=seed, commit=commit, calibration=calibration, pad=pad,
                      lengths=[len(p) for p in prompts], threads=torch.get_num_threads(),
                      cpu=platform.processor() or platform.machine())), flush=True)


def padded(side: str):
    T = max(map(len, prompts))
    ids = torch.full((len(prompts), T), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        at = slice(T - len(p), T) if side == "left" else slice(0, len(p))
        ids[i, at], mask[i, at] = torch.tensor(p), 1
    with torch.no_grad():
        hs = lm.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    return ids, mask, tuple(h.clone() for h in hs)


def invert(path: Path, layer: int) -> dict:
    t = time.perf_counter()
    code = main(["--threads", "2", "invert", str(path), "--model", model, "--layer", str(layer), "--calibration",
                 calibration, "-q", "-o", str(path.with_suffix(f".L{layer}.jsonl"))])
    rows = [json.loads(x) for x in path.with_suffix(f".L{layer}.jsonl").read_text().splitlines()]
    return dict(exit=code, exact=sum(r["ids"] == p and r["status"] != "failed" for r, p in zip(rows, prompts)),
                prompts=len(prompts),
                status={s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}},
                padded=sum(r.get("left_padding", 0) + r.get("right_padding", 0) > 0 for r in rows),
                seconds=round(time.perf_counter() - t, 1))


with tempfile.TemporaryDirectory() as tmp:
    for side in ("left", "right"):
        ids, mask, hs = padded(side)
        path = Path(tmp) / f"{side}.pt"
        torch.save({"hidden_states": hs, "attention_mask": mask, "input_ids": ids}, path)
        for layer in layers:
            print(json.dumps(dict(side=side, layer=layer, mask=True, **invert(path, layer))), flush=True)
        if unmasked:
            torch.save(hs, Path(tmp) / f"{side}-unmasked.pt")
            for layer in layers:
                print(json.dumps(dict(side=side, layer=layer, mask=False,
                                      **invert(Path(tmp) / f"{side}-unmasked.pt", layer))), flush=True)
