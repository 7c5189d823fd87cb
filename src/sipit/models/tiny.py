"""Tiny random decoders: real Hugging Face GPT-2 / Llama models built offline in milliseconds.

    tiny_model("gpt2")                                  # = load_model("tiny-gpt2")
    tiny_model("llama", vocab=9, width=32, depth=2, heads=2, positions=8, activation="relu")

Parameters have our own names (vocab, width, depth, ...), so tests and the theory lab never touch
transformers' config classes. The tokenizer is a 256-token byte-level one (ids >= 256 of a larger
vocabulary have no text).
"""
from __future__ import annotations

import torch

from .lm import LM, ModelError

ARCHS = ("gpt2", "llama")


def tiny_model(arch: str = "gpt2", *, vocab: int = 256, width: int = 64, depth: int = 4, heads: int = 4,
               kv_heads: int | None = None, mlp: int | None = None, positions: int = 512,
               activation: str | None = None, tied: bool | None = None, seed: int = 0,
               name: str | None = None) -> LM:
    """A random decoder (HF's own init under torch.manual_seed(seed)) with the byte tokenizer.

    arch: "gpt2" (LayerNorm, learned positions, MLP 4·width) or "llama" (RMSNorm, rotary, gated
    MLP 2·width, `kv_heads` KV heads: default heads // 2). activation: gelu (GPT-2's default),
    silu (Llama's), relu, tanh, ... tied: share the input embedding and the LM head (default: the
    architecture's tiny default, GPT-2 tied, Llama untied).
    """
    if arch not in ARCHS:
        raise ModelError(f"unknown tiny architecture {arch!r}: use one of {', '.join(ARCHS)}")
    from transformers import AutoModelForCausalLM

    config = _config(arch, vocab, width, depth, heads, kv_heads, mlp, positions, activation, tied)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return LM(name or f"tiny-{arch}", model, byte_tokenizer())


def _config(arch, vocab, width, depth, heads, kv_heads, mlp, positions, activation, tied):
    from transformers import GPT2Config, LlamaConfig

    # bos/eos default to 50256 in GPT2Config: out of range for a small vocabulary (design.md §4).
    common = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    if arch == "gpt2":
        kw = dict(n_positions=positions, n_embd=width, n_layer=depth, n_head=heads, n_inner=mlp,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        if activation is not None:
            kw["activation_function"] = activation
        if tied is not None:
            kw["tie_word_embeddings"] = tied
        return GPT2Config(**kw)
    kw = dict(hidden_size=width, intermediate_size=mlp or 2 * width, num_hidden_layers=depth,
              num_attention_heads=heads, num_key_value_heads=kv_heads or max(1, heads // 2),
              max_position_embeddings=positions, tie_word_embeddings=bool(tied), **common)
    if activation is not None:
        kw["hidden_act"] = activation
    return LlamaConfig(**kw)


def byte_tokenizer():
    """A 256-token byte-level tokenizer that round-trips any text; no special tokens, no BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
