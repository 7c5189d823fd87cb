"""Tiny lab decoders and the set of *all* their prompts.

A lab model is a real Hugging Face GPT-2 or Llama with a vocabulary of a few tokens and a context
of a few positions, so that every prompt of length 1..K can be enumerated and pushed through it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from sipit.io import SipitError
from sipit.models import LM, PRECISIONS, apply_precision, exact_matmul, resolve_device, run_layers, tiny_model

ARCHS = {"gpt2": "LayerNorm, learned absolute positions, MLP", "llama": "RMSNorm, rotary positions, gated MLP"}
ACTIVATIONS = ("gelu", "tanh", "relu")


class LabError(SipitError):
    """A lab configuration that cannot run; the message gives the numbers and what to change."""


@dataclass
class LabModel:
    """A tiny random decoder. `noise` is added (N(0, noise²)) to *every* parameter after the
    Hugging Face init, so that norm gains and zero-initialised biases are drawn from a density
    too, as Theorem 2.2 assumes."""

    arch: str = "gpt2"  # gpt2 (LayerNorm) | llama (RMSNorm)
    vocab: int = 8
    context: int = 5  # longest prompt K
    positions: int = 8  # the model's positions (>= K, +1 with BOS); fixed, so models for K=4, 5, 6 are one model
    width: int = 32
    depth: int = 2
    heads: int = 2
    activation: str = "gelu"  # gelu | tanh | relu
    tied: bool = True  # tie the input embedding and the LM head
    seed: int = 0
    noise: float = 0.02
    bos: bool = False  # prepend a fixed BOS token (id = vocab, an extra embedding row) to every prompt
    precision: str = "fp32"  # fp32 | fp64 | bf16 | fp16 (weights and activations) | int8 | int4 | nf4 | fp4 (weights)
    device: str = "cpu"  # weights are drawn on the CPU (the same model on every device), then moved here

    @property
    def bos_id(self) -> int | None:
        return self.vocab if self.bos else None

    def check(self):
        if self.arch not in ARCHS:
            raise LabError(f"arch {self.arch!r}: use one of {', '.join(ARCHS)}")
        if self.activation not in ACTIVATIONS:
            raise LabError(f"activation {self.activation!r}: use one of {', '.join(ACTIVATIONS)}")
        if not 2 <= self.vocab <= 256:
            raise LabError(f"vocab {self.vocab}: the lab needs 2..256 tokens (4..16 is the useful range)")
        if self.context < 1 or self.depth < 1 or self.heads < 1:
            raise LabError(f"context, depth and heads must be >= 1, got {self.context}, {self.depth}, {self.heads}")
        if self.positions < self.context + self.bos:
            raise LabError(f"positions {self.positions} < context {self.context}{' + BOS' if self.bos else ''}: "
                           f"raise --positions to at least {self.context + self.bos}")
        if self.precision not in PRECISIONS:
            raise LabError(f"precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        if self.width % self.heads or (self.arch == "llama" and (self.width // self.heads) % 2):
            raise LabError(f"width {self.width} must split into {self.heads} heads (of even size for rotary)")

    @property
    def norm(self) -> str:
        return "LayerNorm" if self.arch == "gpt2" else "RMSNorm"

    def describe(self) -> str:
        return (f"{self.arch} ({self.norm}), V={self.vocab}, K={self.context}, d={self.width}, "
                f"{self.depth} layers x {self.heads} heads, {self.activation}, "
                f"{'tied' if self.tied else 'untied'} embeddings, {'BOS, ' if self.bos else ''}"
                f"seed {self.seed}, noise {self.noise:g}" + (f", {self.precision}" if self.precision != "fp32" else ""))

    def to_dict(self) -> dict:
        return asdict(self)


def build(cfg: LabModel) -> LM:
    """The configured model as an `LM` (random weights from `cfg.seed`, plus `cfg.noise`)."""
    cfg.check()
    lm = tiny_model(cfg.arch, vocab=cfg.vocab + cfg.bos, width=cfg.width, depth=cfg.depth, heads=cfg.heads,
                    kv_heads=cfg.heads, positions=cfg.positions, activation=cfg.activation, tied=cfg.tied, seed=cfg.seed,
                    name=f"lab-{cfg.arch}")
    perturb(lm, cfg.noise, seed=cfg.seed + 1)
    device = resolve_device(cfg.device)
    lm.model.to(device)
    exact_matmul(device)  # the lab compares states at 1e-6 of their norm: no TF32
    return lm if cfg.precision == "fp32" else apply_precision(lm, cfg.precision)


@torch.no_grad()
def perturb(lm: LM, sigma: float, seed: int = 0) -> LM:
    """Add N(0, sigma²) to every parameter of lm, in place (tied weights once)."""
    g = torch.Generator().manual_seed(seed)
    for p in lm.model.parameters():
        p.add_(sigma * torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device))  # same draw on any device
    return lm


# ----------------------------------------------------------------------------------------------
# All prompts of length 1..K over V tokens, in order of length, then lexicographic.


@dataclass(frozen=True)
class PromptSet:
    """Every token sequence of length 1..max_len over range(vocab); index i <-> one prompt."""

    vocab: int
    max_len: int

    def count(self, length: int) -> int:
        return self.vocab**length

    def __len__(self) -> int:
        return sum(self.count(k) for k in range(1, self.max_len + 1))

    def offset(self, length: int) -> int:
        """Index of the first prompt of this length."""
        return sum(self.count(k) for k in range(1, length))

    def of_length(self, length: int) -> Tensor:
        """All prompts of one length, in lexicographic order. [V**length, length] int64"""
        digits = torch.arange(self.count(length))[:, None] // self.vocab ** torch.arange(length - 1, -1, -1)
        return digits % self.vocab

    def __getitem__(self, i: int) -> list[int]:
        for k in range(1, self.max_len + 1):
            if i < self.count(k):
                return [(i // self.vocab ** (k - 1 - t)) % self.vocab for t in range(k)]
            i -= self.count(k)
        raise IndexError(i)

    def index(self, ids: list[int]) -> int:
        return self.offset(len(ids)) + sum(v * self.vocab ** (len(ids) - 1 - t) for t, v in enumerate(ids))


def check_size(prompts: PromptSet, width: int, n_layers: int, max_prompts: int):
    """Refuse enumerations that would not fit (states in memory, all pairs in minutes)."""
    n = len(prompts)
    if n > max_prompts:
        gib = n * width * 4 * n_layers / 2**30
        raise LabError(
            f"V={prompts.vocab}, K={prompts.max_len} gives {n:,} prompts ({n * (n - 1) // 2:.2e} pairs, "
            f"{gib:.2f} GiB of float32 states for {n_layers} layer(s) of width {width}); the limit is "
            f"{max_prompts:,} prompts: lower the vocabulary or the context, or raise --max-prompts")


@torch.no_grad()
def last_token_states(lm: LM, prompts: PromptSet, layers: list[int], *, bos: int | None = None,
                      batch: int = 8192) -> Tensor:
    """Last-token state of every prompt at each layer, prompts in PromptSet order (each prompt
    preceded by token `bos` if given). [len(layers), N, d]"""
    out = []
    for k in range(1, prompts.max_len + 1):
        ids = with_bos(prompts.of_length(k), bos)
        for s in range(0, len(ids), batch):
            states = run_layers(lm, layers, ids=ids[s : s + batch].to(lm.device))  # len(layers) x [B, k, d]
            out.append(torch.stack([h[:, -1] for h in states]))
    return torch.cat(out, 1)


def with_bos(ids: Tensor, bos: int | None) -> Tensor:
    """ids [B, T] -> [B, T+1] with `bos` in front (unchanged if bos is None)."""
    return ids if bos is None else torch.cat([ids.new_full((len(ids), 1), bos), ids], 1)
