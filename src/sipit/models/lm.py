"""The LM handle: one loaded causal LM and every architecture lookup the algorithms need.

All knowledge of how a Hugging Face decoder is laid out (where its blocks, final norm, embedding,
attention projections and position table live) is in this file, like tuned-lens's
`model_surgery.py`; the rest of sipit reads models through `LM` and `models/tap.py` only.
"""
from __future__ import annotations

import copy

import hashlib
import inspect
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor, nn

from ..io import SipitError

INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # a float's bits, as integers


class _Probed(Exception):
    """Raised by LM._blocks_return_tuples's hook once block 0 has answered."""


class ModelError(SipitError):
    """A model spec that cannot be loaded, or a layer it does not have; the message says why."""


@dataclass
class LM:
    """A causal LM with its tokenizer and the handles the layer tap needs.

    Layer index ℓ ∈ [0, n_layers] follows HF `output_hidden_states`: 0 = embedding output (the
    input of block 0), ℓ ≥ 1 = residual stream after the ℓ-th block, *without* the final norm.

    `tokenizer` is None for models without one (the `random:<arch>` specs): ids in, ids out.
    `full_layers` is the architecture's depth when only the first blocks were loaded
    (`load_model(..., max_layer=ℓ)`); negative layer indices still count from the real last block.
    """

    name: str
    model: nn.Module  # the full *ForCausalLM
    tokenizer: object | None
    precision: str = "fp32"  # see models/precision.py
    full_layers: int | None = None  # the architecture's depth; None = all blocks are loaded
    base: nn.Module = field(init=False)  # model.model / model.transformer: the decoder without its head (_find_base)
    blocks: nn.ModuleList = field(init=False)
    embed: nn.Module = field(init=False)
    norm: nn.Module = field(init=False)
    _empty_cache: object = field(init=False, default=None, repr=False)

    def __post_init__(self):
        self.model.eval().requires_grad_(False)
        self.base = _find_base(self.model)
        self.blocks = _find_blocks(self.base, self.model.config)
        self.embed = self.model.get_input_embeddings()
        self.norm = _find_final_norm(self.base, self.blocks)

    def run_base(self, cache=None, **inputs):
        """The base model (blocks, no head) on inputs (input_ids or inputs_embeds, position_ids,
        attention_mask), reading and extending `cache` (a transformers Cache) when one is given."""
        return self.base(**inputs, **{self._cache_keyword: cache}, use_cache=cache is not None)

    @cached_property
    def _cache_keyword(self) -> str:
        return cache_keyword(self.base)

    def copy_in(self, dtype: torch.dtype) -> "LM":
        """A copy of this LM with its parameters in `dtype` (buffers such as rotary frequencies kept;
        tied parameters stay tied); the original is untouched. The deep copy finds the cast parameters
        in its memo, so the original's weights are never copied in their own dtype."""
        cast = {id(p): nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in self.model.parameters()}
        return LM(self.name, copy.deepcopy(self.model, memo=cast), self.tokenizer, precision=self.precision,
                  full_layers=self.full_layers)

    @property
    def n_layers(self) -> int:
        """Blocks loaded (= the architecture's depth unless loaded with max_layer)."""
        return len(self.blocks)

    @property
    def d_model(self) -> int:
        """Width of the residual stream, what every layer's state holds: the embedding's, unless a projection widens
        it before block 0 (OPT-350m's project_in, 512 -> 1024), times the streams the blocks carry (Gemma-3n: 4)."""
        project_in = _project_in(self.base)
        width = project_in.out_features if project_in is not None else self.embed.weight.shape[1]
        return width * self.streams

    @property
    def streams(self) -> int:
        """Residual streams the blocks carry side by side: Gemma-3n's AltUp hands [A, B, T, d] from block to block (A =
        4 in E2B and E4B), every other decoder one [B, T, d]. A layer's state is read as the A streams side by side,
        [B, T, A·d] (models/tap.py)."""
        return self.config_value("altup_num_inputs", 1)

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: the candidate set of every inversion."""
        return self.embed.weight.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def half(self) -> bool:
        """Whether the model computes in a 16-bit float (bfloat16, float16)."""
        return self.dtype in (torch.bfloat16, torch.float16)

    @property
    def device(self) -> torch.device:
        """Where the embedding lives: every tensor an algorithm makes for this model goes here."""
        return self.embed.weight.device

    @property
    def depth(self) -> int:
        """The architecture's number of blocks: layer `depth` is the last (the LM head reads it),
        also when only the first `n_layers` blocks were loaded."""
        return self.full_layers or self.n_layers

    @property
    def sliding_window(self) -> int | None:
        """Keys the model's sliding-window layers see (Gemma-3, Mistral), None where no layer slides; from the text
        config, where an image-text model keeps it."""
        return self.config_value("sliding_window") or None

    def config_value(self, name: str, default=None):
        """The text config's `name`, the largest where it varies by block (a list: Gemma-3n's MLP widths; transformers'
        per-layer configs: Gemma-4's head_dim, 256 in its sliding layers and 512 in its global ones); default where
        absent or None."""
        text = self.model.config.get_text_config()
        try:
            value = getattr(text, name, None)
        except RuntimeError:  # (transformers' AmbiguousGlobalPerLayerAttributeError: ask each layer's config)
            value = [getattr(text.per_layer_config[i], name) for i in range(text.num_hidden_layers)]
        value = max(value) if isinstance(value, (list, tuple)) else value
        return default if value is None else value

    @property
    def keys_by_index(self) -> bool:
        """Whether attention biases each key by its index in the pass (ALiBi: BLOOM, MPT, Falcon's ALiBi variant)
        rather than reading positions from position_ids: a key's index must then be its position (models/tap.py)."""
        text = self.model.config.get_text_config()
        return text.model_type == "bloom" or bool(getattr(text, "alibi", False)) or \
            bool(getattr(getattr(text, "attn_config", None), "alibi", False))

    @property
    def fingerprint(self) -> str:
        """Content hash of every loaded tensor, the tokenizer and the precision: what depends on the
        whole model (a worker's copy of it, an audit run). = `fingerprint_through(n_layers)`, so a
        load with max_layer < depth has another one; caches per tap use `fingerprint_through`."""
        return self.fingerprint_through(self.n_layers)

    def fingerprint_through(self, blocks: int) -> str:
        """Content hash of what a tap running blocks 0..blocks-1 reads: the key of caches per tap.

        Tokenizer, precision, the text config's values (_config_digest), every tensor outside the block list
        (embedding, learned positions, final norm, LM head: loaded whatever max_layer is) and the tensors of the
        first `blocks` blocks. Never the spec name (one GGUF by name and by path is one model) nor an object id
        (Python reuses ids), and never the blocks above: the same weights loaded whole or with
        max_layer >= blocks give the same string.
        """
        if not 0 <= blocks <= self.n_layers:
            raise ModelError(f"{self.name} has {self.n_layers} blocks loaded, not {blocks}")
        prefix = _state_dict_prefix(self.model, self.blocks)
        kept = [digest for name, digest in self._tensor_digests.items()
                if not name.startswith(prefix) or int(name[len(prefix):].split(".")[0]) < blocks]
        return _combine(f"through {blocks}:{self.precision}:{self.tokenizer_fingerprint}:{self._config_digest(blocks)}",
                        kept)

    def _config_digest(self, blocks: int) -> str:
        """Hash of the text config's values, which the weights do not say (norm eps, rope base, activation, windows):
        two tiny models of equal weights and other norm eps shared a position-0 table whose bounds then excluded the
        true first token. Per-layer lists cut to the first `blocks`, and not the depth, names, paths or versions, as
        a load with max_layer < depth or from another file of the same weights differs only there."""
        text = self.model.config.get_text_config()
        depth = text.attribute_map.get("num_hidden_layers", "num_hidden_layers")  # (GPT-2's n_layer, MPT's n_layers)
        values = {k: v for k, v in text.to_dict().items()
                  if not k.startswith("_") and k not in _CONFIG_NOT_COMPUTED and k != depth}
        for name in ("layer_types", "attention_layers"):  # (archs.truncate_config cuts these to the blocks loaded)
            if isinstance(values.get(name), list):
                values[name] = values[name][:blocks]
        return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def embedding_fingerprint(self) -> str:
        """Content hash of the embedding rows (and tokenizer, precision): the key of what depends on
        the candidate set only (duplicate classes, near-duplicate tokens)."""
        prefix = _state_dict_prefix(self.model, self.embed)
        kept = [digest for name, digest in self._tensor_digests.items() if name.startswith(prefix)]
        return _combine(f"embedding:{self.precision}:{self.tokenizer_fingerprint}", kept)

    @cached_property
    def _tensor_digests(self) -> dict[str, bytes]:
        """{state-dict name: digest} of every tensor, sorted by name; hashed once, shared by every
        fingerprint (an 8B model has hundreds of tensors).

        The embedding rows (the candidate set; duplicate classes depend on them bit for bit) are
        hashed whole; every other tensor by name, shape, dtype, the exact integer sum of its bit
        patterns and up to 4,096 evenly strided values. (Not a float sum: its rounding depends on the
        summation order, i.e. on the thread count — Gemma-3 hashed differently at 1 and 2 threads.)
        `temporary_edit` and `apply_precision` drop them; after any other in-place edit, call
        `forget_fingerprint()`.
        """
        embedding = _state_dict_prefix(self.model, self.embed)
        return {name: _tensor_digest(name, t.detach(), whole=name.startswith(embedding))
                for name, t in sorted(self.model.state_dict().items())}

    def forget_fingerprint(self):
        """Call after editing weights in place: every fingerprint is recomputed from the new weights."""
        self.__dict__.pop("_tensor_digests", None)

    def layer_index(self, layer: int) -> int:
        """Normalise a layer index (negative counts from the end); raise on out of range."""
        depth = self.depth
        if not -(depth + 1) <= layer <= depth:
            raise ModelError(
                f"layer {layer} out of range for {self.name}: valid layers are 0..{depth} "
                f"(0 = embeddings, i = after block i) or -1..-{depth + 1} from the end"
            )
        index = layer % (depth + 1)
        if index > self.n_layers:
            raise ModelError(f"layer {layer} of {self.name} is not loaded: the model was loaded with "
                             f"max_layer={self.n_layers} (of {depth} blocks); load it with max_layer >= {index}")
        return index

    def encode(self, text: str) -> list[int]:
        """Token ids as the model would see the text (with BOS if the tokenizer adds one)."""
        if self.tokenizer is None:
            raise ModelError(f"{self.name} has no tokenizer (random weights, ids in and ids out): give token "
                             "ids instead of text, e.g. a corpus random:N or an ids file")
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids) -> str:
        """Text of the ids; without a tokenizer the ids themselves, as "[id 1, id 2]"."""
        if self.tokenizer is None:
            return "[" + ", ".join(f"id {int(i)}" for i in ids) + "] (no tokenizer: ids only)"
        return self.tokenizer.decode(list(ids))

    def special_ids(self) -> Tensor:
        """The tokenizer's special token ids (<bos>, <eos>, padding, …) within the model's vocabulary (a tokenizer
        may list added ids past its rows); none without a tokenizer. [n] on the CPU, ascending"""
        ids = getattr(self.tokenizer, "all_special_ids", None) or []
        return torch.tensor(sorted({i for i in ids if 0 <= i < self.vocab_size}), dtype=torch.long)

    @property
    def padding_ids(self) -> list[int]:
        """The ids a batch is most likely padded with: the tokenizer's pad token, its eos (what pad_token is set to where
        a tokenizer has none: GPT-2, Llama-3) and 0 (a batch padded by hand with zeros). In that order, once each."""
        ids = [getattr(self.tokenizer, "pad_token_id", None), getattr(self.tokenizer, "eos_token_id", None), 0]
        return list(dict.fromkeys(i for i in ids if isinstance(i, int) and 0 <= i < self.vocab_size))

    @cached_property
    def tokenizer_fingerprint(self) -> str:
        if self.tokenizer is None:
            return f"ids-only-{self.vocab_size}"
        vocab = sorted(self.tokenizer.get_vocab().items())
        return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]

    @torch.no_grad()
    def unembedding_rows(self) -> Tensor:
        """Rows of the LM head, one per token of the candidate vocabulary: next-token logits = norm(h_L) @ rows.T
        (before any soft-capping). A head padded past the embedding is cut to it; tokens it has no row for (Mllama's
        8 image tokens past its head's rows) get zero rows, a logit of 0 where priors rank them. [V, d]"""
        rows = self.model.get_output_embeddings().weight[:self.vocab_size]
        missing = self.vocab_size - len(rows)
        return torch.cat([rows, rows.new_zeros(missing, rows.shape[1])]) if missing > 0 else rows

    @torch.no_grad()
    def embedding_rows(self) -> Tensor:
        """Embedding rows as the base model takes them as inputs_embeds (Gemma's √d scaling included; OPT-350m's
        project_in, which the base applies, not: [V, 512] there, where the blocks are 1024 wide). [V, e]"""
        return self.embed(torch.arange(self.vocab_size, device=self.device))

    def new_cache(self, blocks: int | None = None):
        """An empty KV cache for a forward pass: transformers' DynamicCache with a plain layer per block,
        sliding-window blocks included; of the first `blocks` only where no pass through it goes higher (a
        tap's: every cache helper then copies fewer layers; SmolLM2 at layer 1, 1 of 30: one prompt 2.93 ->
        2.79 × the forward, docs/results/invert/cache_layers_ab.txt). A sliding layer keeps only the last
        window − 1 positions, and a prefix past the window could then be neither cropped nor grown from a
        pass (SipIt failed on Gemma-3 prompts over 511 tokens); kept whole, the window is still applied by
        the attention mask, which transformers builds from the config, as in the cache-free forward that
        captures states. Copied from one built once (building reads the config per layer: 0.47 ms for
        SmolLM2, a copy 0.03 ms, and every speculation pass paid it). The template's layers hold no cached
        tensors yet, and a layer's update rebinds its keys and values, so shallow copies are independent caches.
        A block with a recurrent state keeps transformers' layer for it (`recurrent`), which fills its state dicts
        in place: each cache gets its own copy (of no tensors). A block that keeps nothing (Nemotron-H's MoE and MLP
        blocks, a KV-sharing block) keeps transformers' placeholder: the masks take the cached length from the first
        layer that can hold keys, which a plain layer in its place would hold none of."""
        if self._empty_cache is None:
            from transformers import DynamicCache
            from transformers.cache_utils import DummyLayer, DynamicLayer, LinearAttentionCacheLayerMixin

            text = self.model.config.get_text_config()
            if self.recurrent and text.model_type not in RECURRENT_CHECKED:
                raise ModelError(f"{self.name}: its {text.model_type} blocks keep a recurrent state, and passes on "
                                 "their cache were not checked to equal its full forward (for "
                                 f"{', '.join(sorted(RECURRENT_CHECKED))} they were): inverting it is not supported "
                                 "(its states can still be captured)")
            self._empty_cache = DynamicCache(config=self.model.config)
            self._empty_cache.layers = [_whole(layer) if isinstance(layer, LinearAttentionCacheLayerMixin) else
                                        layer if isinstance(layer, DummyLayer) else DynamicLayer()
                                        for layer in self._empty_cache.layers]
        cache = copy.copy(self._empty_cache)
        cache.layers = [copy.deepcopy(layer) if hasattr(layer, "recurrent_states") else copy.copy(layer)
                        for layer in self._empty_cache.layers[:self._cache_depth(blocks)]]
        return cache

    def _cache_depth(self, blocks: int | None) -> int | None:
        """Layers a cache of the first `blocks` keeps: those, and up to the first that can hold keys where they have
        none (transformers asks that layer the cached length to build the attention masks, even where no block that
        attends runs: Nemotron-H's and GraniteMoE-Hybrid's Mamba blocks below their first attention; the layer stays
        empty, and so do the masks no block reads). A model without such a layer (Mamba-2) never asks."""
        from transformers.cache_utils import CacheLayerMixin

        layers = self._empty_cache.layers
        if blocks is None or any(isinstance(layer, CacheLayerMixin) for layer in layers[:blocks]):
            return blocks
        return next((i + 1 for i, layer in enumerate(layers) if isinstance(layer, CacheLayerMixin)), blocks)

    @property
    def scans_from_zero(self) -> bool:
        """Whether the model's Mamba-1 blocks start a pass of several tokens from a zero state whatever its cache holds
        (transformers' selective scan: "initial hidden state is not supported by the kernel path"; Jamba, Zamba,
        Mamba, FalconMamba): a pass on a cached prefix then goes a token at a time (models/tap.py)."""
        return self.model.config.get_text_config().model_type in SCANS_FROM_ZERO

    @cached_property
    def recurrent(self) -> bool:
        """Whether some block keeps a recurrent state besides (or instead of) keys and values: gated delta nets
        (Qwen3-Next, Qwen3.5), Mamba (Jamba, Falcon-H1), short convolutions (LFM2). Such a state holds no earlier
        position, so a prefix's cache can be neither cut back nor read off a longer pass: models/tap.py grows it in
        passes of its own instead, and never passes rows flat."""
        return bool(set(getattr(self.model.config.get_text_config(), "layer_types", None) or ()) & RECURRENT_LAYERS)

    @cached_property
    def left_padding_moves(self) -> bool:
        """Whether a plain forward of a left-padded batch (an attention_mask, no position_ids) gives a row's tokens other
        states than the row alone: where positions are learned and counted from the row's start (GPT-2, GPT-Neo: the
        first token sits at the padding's length); not where attention sees distances only (rotary) or the positions
        come from the mask (OPT). One forward of three tokens."""
        ids = torch.tensor([[0, 1, 2]], device=self.device)
        with torch.no_grad():
            alone = self.run_base(input_ids=ids[:, 1:]).last_hidden_state[0].float()
            padded = self.run_base(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1]], device=self.device))
        diff = (padded.last_hidden_state[0, 1:].float() - alone).norm() / alone.norm().clamp_min(1e-30)
        return bool(diff > 1e-3)

    def logits(self, ids: Tensor, cache=None) -> Tensor:
        """Next-token logits [B, T, V] for ids [B, T], after the positions `cache` holds (a transformers Cache, which
        the call extends: step-by-step sampling) when one is given; differentiable when grads are enabled."""
        if cache is None:
            return self.model(input_ids=ids).logits
        return self.model(input_ids=ids, **{cache_keyword(self.model): cache}, use_cache=True).logits

    @torch.no_grad()
    def next_token_logprobs(self, ids: Tensor) -> Tensor | None:
        """log p(· | ids[:i+1]) for every i, as the whole model computes it (soft-capping included):
        ids [T] -> [T, V] float32; None when only the first blocks were loaded (max_layer < depth)."""
        if self.n_layers < self.depth:  # not `full_layers is not None`: max_layer = depth loads every block
            return None
        return self._logprobs(self.logits(ids[None].to(self.device))[0])

    @torch.no_grad()
    def next_token_logprobs_from(self, layer: int, states: Tensor) -> Tensor | None:
        """next_token_logprobs of a prompt read off its residual states at `layer` ([T, d], as LayerTap observes
        them: no final norm) instead of its ids: only the blocks from `layer` up and the head run, the ones below
        hand the states on untouched, so it costs the part of a forward above the layer (SmolLM2 at layer 15:
        half). The same numbers as from the ids, up to the states' own error. [T, V] float32; None when only
        the first blocks were loaded."""
        if self.n_layers < self.depth:
            return None
        if self.streams > 1:  # (Gemma-3n's streams are mixed before its norm: nothing in sipit asks for it there)
            raise ModelError(f"{self.name}: log-probs off a layer's states of {self.streams} streams are not supported")
        h = states[None].to(self.device, self.dtype)
        tuples = self._blocks_return_tuples

        def given(module, args, kwargs):  # the first block to run reads h
            return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

        def skip(hidden_states, *args, **kwargs):  # a block below the layer: its input, as its output
            return (hidden_states,) if tuples else hidden_states

        below = list(self.blocks[:layer])
        saved = [block.__dict__.get("forward") for block in below]  # (an instance's own forward: accelerate's)
        if layer < self.n_layers:
            handle = self.blocks[layer].register_forward_pre_hook(given, with_kwargs=True)
        else:  # the last block's output is h, whatever the base applies after it (lm.norm: one module or two)
            handle = self.blocks[-1].register_forward_hook(lambda module, args, out: (h,) if tuples else h)
        for block in below:
            block.forward = skip
        try:
            logits = self.model(input_ids=torch.zeros(h.shape[:2], dtype=torch.long, device=self.device),
                                use_cache=False).logits
        finally:
            handle.remove()
            for block, forward in zip(below, saved):
                if forward is None:
                    del block.forward
                else:
                    block.forward = forward
        return self._logprobs(logits[0])

    def _logprobs(self, logits: Tensor) -> Tensor:
        """The LM head's logits [T, V_head] -> log-probs over the candidate vocabulary [T, V] float32: a head padded
        past the embedding cut to it, tokens the head has no row for (Mllama's image tokens) at −inf."""
        logp = torch.log_softmax(logits[:, :self.vocab_size].float(), -1)
        missing = self.vocab_size - logp.shape[1]
        return torch.cat([logp, logp.new_full((len(logp), missing), float("-inf"))], 1) if missing > 0 else logp

    @cached_property
    def _blocks_return_tuples(self) -> bool:
        """Whether this transformers version's blocks return a tuple (older ones) or the hidden states: one
        token through block 0 tells."""
        seen = []

        def probe(module, args, out):
            seen.append(isinstance(out, tuple))
            raise _Probed

        handle = self.blocks[0].register_forward_hook(probe)
        try:
            self.run_base(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.device))
        except _Probed:
            pass
        finally:
            handle.remove()
        return seen[0]


# Attention modules whose output for a token that attends to itself alone is o_proj of its value (each query head
# reading its key-value head's): one key, so softmax gives exactly 1 and 1·v = v; no sinks, no norm on the value.
ONE_KEY_ATTENTION = {"LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention", "GemmaAttention",
                     "Gemma2Attention", "Gemma3Attention"}


def _value_only(attention: nn.Module, forward):
    """attention's forward for one-token sequences without a cache: o_proj of the value, no query, key, rotary or
    attention kernel; anything else (a cache handed in, e.g. by models.edit's KV edits; more tokens) goes to
    `forward`, the module's own."""
    keyword = cache_keyword(attention)

    def value_only(hidden_states, *args, **kwargs):
        B, T = hidden_states.shape[:2]
        if T != 1 or kwargs.get(keyword) is not None:
            return forward(hidden_states, *args, **kwargs)
        v = attention.v_proj(hidden_states).view(B, T, -1, attention.head_dim)
        return attention.o_proj(v.repeat_interleave(attention.num_key_value_groups, dim=2).reshape(B, T, -1)), None
    return value_only


@contextmanager
def one_token_attention(lm: LM):
    """Inside, passes of one-token sequences without a cache (every token its own prompt: the position-0 table, a
    fast calibration's position-0 sample) skip what attention to a single key cannot change: the same states
    (torch.equal on the CPU for every architecture of ONE_KEY_ATTENTION: tests/models/test_lm.py; SmolLM2's and
    Gemma-3's tables), in 0.81 of the time for SmolLM2's table, 0.55 on its bfloat16 copy, 0.82 for Gemma-3-270M's
    (docs/results/invert/one_token_ab.txt). Modules of other classes, or with a forward of their own (accelerate's
    device hooks), run as they are."""
    modules = [getattr(block, "self_attn", None) for block in lm.blocks]  # (where every class above keeps it)
    modules = [m for m in modules if type(m).__name__ in ONE_KEY_ATTENTION and "forward" not in m.__dict__]
    for m in modules:
        m.forward = _value_only(m, m.forward)
    try:
        yield
    finally:
        for m in modules:
            del m.forward


@contextmanager
def temporary_edit(lm: LM):
    """Edit lm's weights in place inside the block; every parameter and buffer is restored on exit.

    >>> with temporary_edit(lm):
    ...     for w in attention_weights(lm, 0)["qk"]: w.zero_()
    ...     states = ...                      # the edited model
    >>> # lm is bit-identical to before here
    """
    saved = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    lm.forget_fingerprint()
    try:
        yield lm
    finally:
        lm.model.load_state_dict(saved)
        lm.forget_fingerprint()


RECURRENT_LAYERS = {"linear_attention", "hybrid", "hybrid_sliding", "conv"}  # transformers' layer types of blocks with
#                    a state other than keys and values (gated delta nets, Mamba, short convolutions: Qwen3-Next,
#                    Falcon-H1, Jamba, LFM2)
RECURRENT_CHECKED = {"lfm2", "lfm3", "qwen3_next", "qwen3_5_text", "jamba", "olmo_hybrid", "falcon_h1", "mamba",
                     "falcon_mamba", "mamba2", "nemotron_h", "bamba", "granitemoehybrid", "zamba2"}  # model types with
#                    recurrent blocks whose passes on a cache equal the full forward (docs/results/models/decoders.py);
#                    RecurrentGemma's do not (ε 14: its blocks keep their state outside the cache), MiniMax has a cache
#                    of its own
SCANS_FROM_ZERO = {"jamba", "zamba", "mamba", "falcon_mamba"}  # model types whose multi-token scans ignore the cache
_CONFIG_NOT_COMPUTED = ("transformers_version", "architectures", "dtype", "torch_dtype", "num_hidden_layers",
                        "use_cache", "output_hidden_states", "output_attentions", "return_dict", "id2label",
                        "label2id")  # (and the depth under its own name: LM._config_digest)


def _whole(layer):
    """A recurrent block's cache layer with keys kept whole where it would keep a sliding window's (as new_cache
    keeps every attention layer's)."""
    from transformers import cache_utils

    if isinstance(layer, cache_utils.LinearAttentionAndSlidingWindowAttentionLayer):
        return cache_utils.LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
    return layer


def _state_dict_prefix(model: nn.Module, module: nn.Module) -> str:
    """Prefix of `module`'s tensors in model.state_dict(): e.g. "model.layers." for the blocks."""
    return next(name for name, m in model.named_modules() if m is module) + "."


def _tensor_digest(name: str, t: Tensor, whole: bool) -> bytes:
    """sha256 of name, shape, dtype and the values (all bytes when `whole`, else the exact integer
    sum of the bit patterns and up to 4,096 strided values; see LM._tensor_digests)."""
    h = hashlib.sha256(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
    flat = t.reshape(-1)
    if whole:
        h.update(flat.contiguous().view(torch.uint8).cpu().numpy())
    elif flat.numel() and flat.is_floating_point():
        bits = flat.contiguous().view(INT_OF_SIZE[flat.element_size()])
        total = sum(int(chunk.long().sum()) for chunk in bits.split(1 << 22))  # exact, any order
        h.update(total.to_bytes(16, "little", signed=True))
        h.update(flat[:: max(1, flat.numel() // 4096)].float().cpu().contiguous().numpy().tobytes())
    return h.digest()


def _combine(header: str, digests: list[bytes]) -> str:
    """One fingerprint (16 hex digits) of a header and per-tensor digests."""
    h = hashlib.sha256(header.encode())
    for d in digests:
        h.update(d)
    return h.hexdigest()[:16]


def _find_base(model: nn.Module) -> nn.Module:
    """The decoder without its head, the module whose children are the blocks: model.get_decoder() (OPT: its
    OPTDecoder below OPTModel; an image-text model's language model, not its vision tower, whose block list may be
    as long), or where that is the model itself (Llama-4's text model) its child holding a block list."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is not None and decoder is not model:
        return decoder
    if model.base_model is not model:
        return model.base_model
    for child in model.children():
        if any(isinstance(m, nn.ModuleList) and len(m) > 0 for m in child.children()):
            return child
    raise ModelError(f"{type(model).__name__}: no decoder holding transformer blocks found")


def _find_blocks(base: nn.Module, config) -> nn.ModuleList:
    n = getattr(config.get_text_config(), "num_hidden_layers", None)
    lists = [m for m in base.children() if isinstance(m, nn.ModuleList) and len(m) > 0]
    lists = [m for m in lists if n is None or len(m) == n] or lists
    if not lists:
        raise ModelError(f"{type(base).__name__}: no ModuleList of transformer blocks found")
    return lists[0]


def _find_final_norm(base: nn.Module, blocks: nn.ModuleList) -> nn.Module:
    """What the base model applies to the last block's output, so that the LM head can read it: its final norm,
    then, where the blocks are wider than the embedding, the projection back (OPT-350m: no final norm, its
    blocks end normed, and project_out, 1024 -> 512); where the blocks carry several streams, their mixing first
    (Gemma-3n: _StreamsMixed)."""
    if isinstance(getattr(base, "altup_unembed_projections", None), nn.ModuleList):
        return _StreamsMixed(base.altup_unembed_projections, base.norm)
    project_out = getattr(base, "project_out", None)
    for name in ("norm", "ln_f", "final_layer_norm", "final_layernorm", "final_norm"):
        if isinstance(getattr(base, name, None), nn.Module):
            norm = getattr(base, name)
            break
    else:
        norms = [m for m in base.children() if "norm" in type(m).__name__.lower()]
        if not norms and not isinstance(project_out, nn.Linear):
            raise ModelError(f"{type(base).__name__}: no final norm module found")
        norm = norms[-1] if norms else nn.Identity()
    return nn.Sequential(norm, project_out) if isinstance(project_out, nn.Linear) else norm


class _StreamsMixed(nn.Module):
    """Gemma-3n's end of the block stack (Gemma3nTextModel.forward, in its order of operations): the A streams of the
    last block's output, side by side as LayerTap reads them ([..., A·d]), made one (stream 0 and each other stream's
    unembedding projection scaled to stream 0's root mean square, averaged), then the final norm: -> [..., d]."""

    def __init__(self, unembed: nn.ModuleList, norm: nn.Module):
        super().__init__()
        self.unembed, self.norm = unembed, norm

    def forward(self, h: Tensor) -> Tensor:
        streams = h.unflatten(-1, (len(self.unembed) + 1, -1)).movedim(-2, 0)  # [A, ..., d]
        target = torch.mean(streams[0] ** 2, dim=-1, keepdim=True) ** 0.5
        mixed = [streams[0]]
        for project, stream in zip(self.unembed, streams[1:]):
            x = project(stream)
            mixed.append(x * target / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True).clamp(min=1e-5)))
        return self.norm(torch.mean(torch.stack(mixed), dim=0))


def _project_in(base: nn.Module) -> nn.Linear | None:
    """The projection from the embedding's width to the blocks' (OPT-350m), or None."""
    project_in = getattr(base, "project_in", None)
    return project_in if isinstance(project_in, nn.Linear) else None


# ----------------------------------------------------------------------------------------------
# Named weights, for experiments that edit them (the theory lab's counterexamples). Every function
# returns *views* of the parameters: edit them in place under torch.no_grad() (or temporary_edit).


def cache_keyword(module: nn.Module) -> str:
    """The keyword `module`'s forward takes its KV cache by: `cache` from transformers 5.2x on, where
    `past_key_values` still passes (with a FutureWarning) but an attention module that gets both
    silently uses `cache` (so a KV edit passed as past_key_values did nothing); `past_key_values`
    before; `layer_past` in GPT-Neo's attention."""
    params = inspect.signature(module.forward).parameters
    return next((k for k in ("cache", "past_key_values", "layer_past") if k in params), "past_key_values")


def attention_module(lm: LM, block: int) -> torch.nn.Module:
    """The attention module of block `block` (0-based)."""
    b = lm.blocks[block]
    b = getattr(b, "shared_transformer", b)  # Zamba2's hybrid block: a shared attention block of its own (tied weights)
    # (BLOOM, Falcon: self_attention; Nemotron-H: a `mixer` of the block's kind; GraniteMoE-Hybrid: self_attn is None
    # in a Mamba block)
    for name in ("self_attn", "attn", "attention", "self_attention", "mixer"):
        module = getattr(b, name, None)
        if module is not None and (name != "mixer" or type(module).__name__.endswith("Attention")):
            return module
    raise ModelError(f"{lm.name}: block {block} (0-based) has no attention module of its own (a recurrent block, as "
                     "Mamba's or a gated delta net's, or a block of an MLP or MoE only, as some of Nemotron-H's?), so no "
                     "keys and values of its own: choose a block that attends")


def reads_earlier_kv(lm: LM, block: int) -> bool:
    """Whether block `block` (0-based) keeps no keys and values of its own and attends with an earlier block's
    (Gemma-3n's and Gemma-4's KV sharing)."""
    return bool(getattr(attention_module(lm, block), "is_kv_shared_layer", False))


def attention_weights(lm: LM, block: int) -> dict[str, list[Tensor]]:
    """Attention parameters of block `block` (0-based): "qk" = query and key weights and biases
    (zero them and every score is equal: uniform causal attention), "out" = the output projection
    (zero it and the block's attention adds nothing to the residual stream)."""
    a = attention_module(lm, block)

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
