"""Capture hidden states of prompts at one layer: what a user would have leaked or stored."""
from __future__ import annotations

import torch
from torch import Tensor

from .models import LM, LayerTap


@torch.no_grad()
def capture(lm: LM, prompts: list[list[int]], layer: int, final_norm: bool = False,
            batch_size: int = 16) -> list[Tensor]:
    """States [T_i, d] of each prompt at `layer`, from one ordinary full forward pass per batch.

    Prompts are right-padded within a batch; causal attention makes the real positions exact
    (no position attends to the padding after it), so no attention mask is needed.
    """
    tap = LayerTap(lm, layer, final_norm)
    out: list[Tensor] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        ids = torch.zeros(len(batch), max(map(len, batch)), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, : len(p)] = torch.tensor(p)
        states = tap.states(ids)
        out.extend(states[i, : len(p)].clone() for i, p in enumerate(batch))
    return out
