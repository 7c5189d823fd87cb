"""random:opt-350m at its published size (24 blocks of 1024 between project_in and project_out, a 512-wide embedding and
head, no final norm): states at layers 1, 12 and 24 and the last layer through project_out (`final_norm`), 4 prompts of
16 random ids each (seed: argv[1], default 2), inverted in lock-step under the measured ε with the fast calibration.
`python opt_350m.py [SEED]` -> one line a layer."""
import sys
import time

import torch

from sipit.invert import InvertConfig, invert
from sipit.invert.learned.config import LearnedConfig
from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
start = time.perf_counter()
lm = load_model("random:opt-350m")
print(f"built in {time.perf_counter() - start:.1f} s: d = {lm.d_model}, embedding {tuple(lm.embedding_rows().shape)}, "
      f"head {tuple(lm.unembedding_rows().shape)}", flush=True)
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ids = torch.randint(3, lm.vocab_size, (4, 16), generator=torch.Generator().manual_seed(seed))
with torch.no_grad():
    hidden = lm.model(ids, output_hidden_states=True).hidden_states  # [-1]: after project_out
for layer, final_norm in ((1, False), (12, False), (24, False), (24, True)):
    tap = LayerTap(lm, layer, final_norm=final_norm)
    states = tap.states(ids)
    same = bool(torch.equal(states, hidden[layer])) if layer < 24 or final_norm else "-"
    start = time.perf_counter()
    r = invert(lm, states, layer, InvertConfig(learned=LearnedConfig.fast()), progress=False, true_ids=ids.tolist(),
               tap=tap)
    print(f"{tap.key}: dim {tap.dim}, equal to transformers' hidden_states: {same}; "
          f"{sum(p.exact for p in r.prompts)}/4 exact, {sorted({p.status for p in r.prompts})}, eps {r.eps:.2e}, "
          f"{time.perf_counter() - start:.1f} s with its calibration, "
          f"{r.summary()['forward_equivalents_per_prompt']:.2f} forward equivalents a prompt", flush=True)
