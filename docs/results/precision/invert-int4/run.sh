#!/bin/bash
cd /work/wt-noise
PYTHONPATH=src /work/main/.venv/bin/python - <<'PY'
import torch, json, time
torch.set_num_threads(1)
from sipit.models import load_model
from sipit.corpora import sample
from sipit.capture import capture
from sipit.states import save_states
t=time.time()
lm = load_model("smollm2", precision="int4")
ps = sample("prose:6,code:4", lm.tokenizer if hasattr(lm,'tokenizer') else lm, 20, seed=0)
ids = [list(p.ids) for p in ps]
st = capture(lm, ids, 15)
save_states("/work/results/precision/invert-int4/states.safetensors", st, model="smollm2", layer=15, final_norm=False,
            tokenizer=lm.tokenizer_fingerprint, precision="int4", ids=ids)
print("captured", time.time()-t, flush=True)
PY
PYTHONPATH=src /work/main/.venv/bin/python -m sipit.cli --threads 1 invert /work/results/precision/invert-int4/states.safetensors -q -o /work/results/precision/invert-int4/results.jsonl
echo rc=$?
