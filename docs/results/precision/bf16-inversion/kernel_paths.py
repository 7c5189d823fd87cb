"""Why a search pass of a bfloat16 model is not the observation's: attention kernels take their path by the
sequence's length, and bfloat16 carries the difference up the layers.

1. torch's scaled_dot_product_attention on this CPU, bfloat16, random q, k, v (9 heads of 64, 20 positions): row 1
   of a causal forward of n positions, and of one query on n keys masked to the first 2, bit-equal to row 1 of the
   causal forward of 20 or not.
2. SmolLM2-135M in bfloat16 (the seed's prompts as tools.py samples them; PROMPT, POSITION, LAYER): the observation at
   POSITION from one transformers forward of all the prompts against the same token (and others) recomputed in
   forwards of n tokens, in a search pass on a cached prefix (tap.extend: a row of one token), and in such a pass
   whose rows carry dummy tokens after it.

    python kernel_paths.py SEED PROMPT POSITION LAYER TOKEN...    e.g. python kernel_paths.py 1277 13 1 15 13975 17194"""
import sys

import torch
import torch.nn.functional as F

from sipit.bench.invert import prompts
from sipit.invert.verify import rel_distance
from sipit.models import LayerTap, load_model

seed, i, t, layer = (int(x) for x in sys.argv[1:5])
others = [int(x) for x in sys.argv[5:]]
torch.set_num_threads(2)

print("1. scaled_dot_product_attention, bfloat16, row 1 against the causal forward of 20 positions:")
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 9, 20, 64, generator=g).mul(3).bfloat16() for _ in range(3))
full = F.scaled_dot_product_attention(q, k, v, is_causal=True)[0, :, 1]
for n in (2, 4, 7, 8, 9, 16):
    same = torch.equal(F.scaled_dot_product_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], is_causal=True)[0, :, 1], full)
    mask = torch.zeros(1, 1, 1, n, dtype=torch.bool)
    mask[..., :2] = True
    one = torch.equal(F.scaled_dot_product_attention(q[:, :, 1:2], k[:, :, :n], v[:, :, :n], attn_mask=mask)[0, :, 0], full)
    print(f"   {n:2d} positions: causal forward {'equal' if same else 'differs'}, one query on {n} keys {'equal' if one else 'differs'}")

lm = load_model("smollm2", precision="bf16")
ids = torch.tensor([p for _, p in prompts(lm, ["prose", "code", "random", "chat"], 4, 20, seed)])
with torch.no_grad():
    y = lm.model(input_ids=ids, output_hidden_states=True).hidden_states[layer][i, t].float()
truth = int(ids[i, t])
tokens = [truth, *others]
names = lm.tokenizer.convert_ids_to_tokens(tokens)
print(f"2. SmolLM2 bfloat16, seed {seed}, prompt {i}, position {t} after {lm.tokenizer.convert_ids_to_tokens(ids[i, :t].tolist())}, "
      f"layer {layer}: relative distance to the observation (one forward of all {len(ids)} prompts); truth {names[0]!r}")
tap = LayerTap(lm, layer)
with torch.no_grad():
    for n in (t + 1, 4, 6, 7, 8, 12, 20):
        if n <= t:
            continue
        row = []
        for v_ in tokens:
            x = ids[i, :n].clone()
            x[t] = v_
            row.append(float(rel_distance(lm.model(input_ids=x[None], output_hidden_states=True).hidden_states[layer][0, t].float(), y)))
        print(f"   forward of {n:2d} tokens: " + ", ".join(f"{name!r} {d:.4f}" for name, d in zip(names, row)))
    prefix = tap.prefill(ids[i, :t])
    cand = torch.tensor(tokens)
    for extra in (0, 6 - t, 19 - t):
        rows = torch.cat([cand[:, None], torch.zeros(len(cand), extra, dtype=torch.long)], 1)
        h = tap.extend(prefix, rows, layout="padded")[:, 0].float()
        print(f"   search pass on the cached prefix, rows of {1 + extra:2d} tokens ({t + 1 + extra} keys): "
              + ", ".join(f"{name!r} {float(d):.4f}" for name, d in zip(names, rel_distance(h, y))))
