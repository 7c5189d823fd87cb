"""Named weights of a decoder, for experiments that edit them (the theory lab's counterexamples).

Every function returns *views* of the model's parameters, so callers can edit them in place
(under `torch.no_grad()`): `for w in attention_weights(lm, 0)["qk"]: w.zero_()`.
"""
from __future__ import annotations

from torch import Tensor

from .load import LM, ModelError


def _attention(lm: LM, block: int):
    b = lm.blocks[block]
    for name in ("self_attn", "attn", "attention"):
        if hasattr(b, name):
            return getattr(b, name)
    raise ModelError(f"{lm.name}: block {block} has no attention module")


def attention_weights(lm: LM, block: int) -> dict[str, list[Tensor]]:
    """Attention parameters of block `block` (0-based): "qk" = query and key weights and biases
    (zero them and every score is equal: uniform causal attention), "out" = the output projection
    (zero it and the block's attention adds nothing to the residual stream)."""
    a = _attention(lm, block)

    def wb(m):
        return [m.weight] + ([m.bias] if getattr(m, "bias", None) is not None else [])

    if hasattr(a, "q_proj") and hasattr(a, "k_proj"):  # Llama, Gemma, Qwen, ...
        return {"qk": wb(a.q_proj) + wb(a.k_proj), "out": wb(a.o_proj)}
    if hasattr(a, "c_attn"):  # GPT-2: one Conv1D [d, 3d] holding q | k | v
        d = lm.d_model
        return {"qk": [a.c_attn.weight[:, : 2 * d], a.c_attn.bias[: 2 * d]], "out": wb(a.c_proj)}
    raise ModelError(f"{lm.name}: unknown attention layout {type(a).__name__}")


def position_table(lm: LM) -> Tensor | None:
    """Learned absolute position embeddings [P, d] (GPT-2), or None (rotary models: Llama, ...)."""
    for name in ("wpe", "embed_positions", "position_embeddings"):
        m = getattr(lm.base, name, None)
        if m is not None and hasattr(m, "weight"):
            return m.weight
    return None
