"""What makes a recovered token certain: ε-acceptance, margins, duplicate-token classes.

A candidate token v is *accepted* at position t when the state it produces on the verified prefix,
recomputed through the layer tap, is within ε of the observed state, relatively:

    ‖h_t(π ⊕ v) − ĥ_t‖ / ‖ĥ_t‖ ≤ ε.

ε is relative because state norms vary by orders of magnitude across positions, layers and models
(position 0 of Llama-type models carries "massive activations"). The noise to tolerate is that of
recomputation — KV cache vs one full forward, batched vs single — plus the rounding of the file's
dtype; the gap to tolerate it against is the distance between the states of *different* tokens.
Measured on SmolLM2 (float32, CPU): recomputation noise (speculative pass on a KV cache, batched
candidates) vs one full forward ≤ 2e-6 relative at layers 1/15/30; the nearest other token is
much farther except at position 0, where Llama-type models put a huge token-independent
"attention sink" component: there the median nearest-token gap is 3e-3 at ℓ=15 (0.1% quantile
1.4e-3), and two special tokens with near-identical dequantized embeddings sit 5e-6 apart (a real
near-collision, reported as such). ε = 1e-4 is 50× the noise and 14× below the 0.1% gap.
States stored in float16 / bfloat16 add their unit roundoff u (‖round(x) − x‖ ≤ u‖x‖).

The *margin* of a position is the relative distance of the best other candidate that was actually
evaluated (excluding the accepted token's duplicate class); `margin_over` says how many other
tokens it covers. Tokens with bit-identical embedding rows produce identical states at every layer
and every position: they form equivalence classes that no method can separate.
"""
from __future__ import annotations

import torch
from torch import Tensor

EPS_FLOAT32 = 1e-4
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8,
                 torch.float64: 2.0 ** -53}


def tolerance(dtype: torch.dtype = torch.float32) -> float:
    """The relative acceptance threshold ε for states stored in `dtype`: rounding x to x̃ moves it
    by ‖x̃ − x‖ ≤ u‖x‖, so a recomputation within ε₀ of x is within (ε₀ + u)/(1 − u) of x̃."""
    u = UNIT_ROUNDOFF.get(dtype, 2.0 ** -8)
    return (EPS_FLOAT32 + u) / (1 - u)


def rel_distance(h: Tensor, target: Tensor) -> Tensor:
    """Relative distance ‖h − target‖ / ‖target‖ over the last dim, in float64.

    h [..., d] and target [..., d] broadcast (e.g. h [B, d] vs target [d] -> [B];
    h [B, k, d] vs target [k, d] -> [B, k]).
    """
    h, target = h.double(), target.double()
    return (h - target).norm(dim=-1) / target.norm(dim=-1).clamp_min(1e-30)


class DuplicateClasses:
    """Tokens whose embedding rows (as block 0 sees them) are bit-identical.

    `rep[v]` is the smallest id of v's class; `members(v)` lists the class (just [v] if unique).
    """

    def __init__(self, embeddings: Tensor):
        """embeddings [V, d]"""
        V = embeddings.shape[0]
        bits = embeddings.detach().float().contiguous().view(torch.int32)  # exact equality = equal bits
        weights = torch.randint(1, 2 ** 61, (bits.shape[1],), generator=torch.Generator().manual_seed(0)) | 1
        key = torch.cat([(chunk.long() * weights).sum(1) for chunk in bits.split(8192)])  # wraps mod 2^64
        self.rep = torch.arange(V)
        order = torch.argsort(key, stable=True)
        sorted_key = key[order]
        same = torch.nonzero(sorted_key[1:] == sorted_key[:-1]).flatten()
        for i in same.tolist():  # hash ties: confirm bit equality, then union with the earlier row
            a, b = order[i].item(), order[i + 1].item()
            if torch.equal(bits[a], bits[b]):
                ra, rb = self.rep[a].item(), self.rep[b].item()
                r = min(ra, rb)
                self.rep[self.rep == ra] = r
                self.rep[self.rep == rb] = r
        self.classes: dict[int, list[int]] = {}
        for v in torch.nonzero(self.rep != torch.arange(V)).flatten().tolist():
            self.classes.setdefault(self.rep[v].item(), [self.rep[v].item()]).append(v)

    def members(self, v: int) -> list[int]:
        return self.classes.get(int(self.rep[v]), [int(v)])

    @property
    def n_duplicates(self) -> int:
        """Number of ids that share their embedding row with another id."""
        return sum(len(c) for c in self.classes.values())

    def __repr__(self):
        return f"DuplicateClasses({len(self.classes)} classes, {self.n_duplicates} ids)"
