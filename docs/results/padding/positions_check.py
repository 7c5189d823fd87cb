"""Where left padding moves a prompt's states, and what the padding's own states are (docs/results/padding/README.md).

    python positions_check.py

For real SmolLM2-135M (layers 1, 3, 15) and random-init models of other architectures (layer 2): prompts left-padded in
one batch, one plain forward (attention_mask, no position_ids) and one with position_ids from the mask (generate()'s
and nnsight's), each row's prompt positions against the prompt alone (largest relative distance); and whether the
padding's states are one state, bit for bit, at every position of every row."""
import torch

from sipit.models import LayerTap, load_model

torch.set_num_threads(2)
PROMPTS = [[504, 2644, 2643, 335, 260, 1171, 284, 5328], [17, 905], [23, 378, 198, 27]]


def check(spec: str, layers: list[int]) -> None:
    lm = load_model(spec)
    T = max(map(len, PROMPTS))
    ids, mask = torch.zeros(len(PROMPTS), T, dtype=torch.long), torch.zeros(len(PROMPTS), T, dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        ids[i, T - len(p):], mask[i, T - len(p):] = torch.tensor([t % lm.vocab_size for t in p]), 1
    with torch.no_grad():
        plain = lm.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        counted = lm.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0),
                           output_hidden_states=True).hidden_states
    for layer in layers:
        tap = LayerTap(lm, layer)
        worst = {"plain": 0.0, "position_ids": 0.0}
        for i in range(len(PROMPTS)):
            m = mask[i].bool()
            own = tap.states(ids[i][m][None])[0]
            for name, hs in (("plain", plain), ("position_ids", counted)):
                d = ((hs[layer][i][m] - own).norm(dim=-1) / own.norm(dim=-1)).max()
                worst[name] = max(worst[name], float(d))
        pads = plain[layer][~mask.bool()]
        one = bool((pads == pads[0]).all())
        print(f"{spec:24s} layer {layer:2d}: plain forward {worst['plain']:.2e}, position_ids from the mask "
              f"{worst['position_ids']:.2e}; padding one state bit for bit: {one} "
              f"(left_padding_moves: {lm.left_padding_moves})", flush=True)


check("smollm2", [1, 3, 15])
for spec in ("tiny-gpt2", "tiny-llama", "random:tinystories-33m", "random:phi-4-mini", "random:gemma-3-1b",
             "random:opt-350m"):
    check(spec, [2])
