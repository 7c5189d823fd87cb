"""Devices: which one, exact float32 matmuls on it, and batch sizes that fit its free memory.

    dev = resolve_device("auto")                     # cuda when available, else cpu
    exact_matmul(dev)                                # TF32 off: verification compares at 1e-7
    screen_dtype(dev)                                # bfloat16 where native: rankings only
    b = batch_for(dev, bytes_per_item=4 * d * T, cap=4096)
    memory_left(dev, model.parameters())             # bytes free on the device (RAM on a CPU), or None
    out = retry_on_oom(lambda b: run(batch=b), b)    # halves b on CUDA out-of-memory
    sync(dev)                                        # before reading a host clock
"""
from __future__ import annotations

import bisect
from typing import Callable, TypeVar

import torch

from .lm import ModelError

T = TypeVar("T")


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


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA runs asynchronously), so a host clock times them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def screen_dtype(device: torch.device) -> torch.dtype:
    """The dtype for *screening* products (rankings, never verification): bfloat16 where the hardware
    multiplies it natively (CUDA with bf16, CPUs with AVX512-BF16 or AMX: a [19, 128] x [128, 49152]
    product 6.4 -> 2.5 ms on this project's 2-core EPYC), else float32."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private, so looked up with a default
        native = any(getattr(torch.cpu, f, lambda: False)() for f in checks)
        return torch.bfloat16 if native else torch.float32
    return torch.float32


def exact_matmul(device: torch.device | str):
    """On CUDA, make float32 matmuls and convolutions true float32 (no TF32, "highest" precision).

    TF32 keeps 10 mantissa bits (relative error ~5e-4): far above the ~1e-7 relative rounding that
    SipIt's ε and the pairwise recheck are derived from, so a verification would accept wrong
    tokens or reject true ones. Process-wide (torch has no per-model switch); a no-op elsewhere.
    """
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")


def free_bytes(device: torch.device | str) -> int | None:
    """Memory a CUDA device can still give this process, in bytes; None elsewhere (no limit known).

    The driver's free memory (torch.cuda.mem_get_info) plus what PyTorch's caching allocator holds
    unused: it keeps a pass's blocks for the next, and each search pass of a growing prefix asks for
    a little more, so counting them as taken shrank later passes (an 8B model's 160-token prompt on an
    H200: 37 passes a position before, 21.7 after; docs/results/gpu/README.md)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def memory_left(device: torch.device | str, keep=()) -> int | None:
    """Memory this process can still take on the device, in bytes: free_bytes on CUDA, the kernel's
    MemAvailable (free and reclaimable RAM) on a Linux CPU less what of `keep` (tensors that must stay in
    memory: a model's parameters) maps a file; None where unknown. Weights loaded from safetensors are
    memory-mapped: read into the page cache on first use, which MemAvailable counts as free (all 538 MB of
    SmolLM2's dequantized weights, 7 GB of Qwen2.5-1.5B's)."""
    device = torch.device(device)
    if device.type == "cuda":
        return free_bytes(device)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024 - file_backed_bytes(keep)
    except (OSError, KeyError, ValueError):
        return None


def file_backed_bytes(tensors) -> int:
    """Bytes of the tensors' distinct storages that lie in a file's memory mapping (/proc/self/maps: Linux;
    0 elsewhere)."""
    maps = []  # (start, end) of each file's mapping
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()  # address range, permissions, offset, device, inode[, path]
                if len(fields) > 5 and fields[5].startswith("/"):
                    start, end = fields[0].split("-")
                    maps.append((int(start, 16), int(end, 16)))
    except OSError:
        return 0
    maps.sort()
    starts = [a for a, _ in maps]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.device.type == "cpu"}
    total = 0
    for ptr, size in storages.items():
        i = bisect.bisect_right(starts, ptr) - 1
        if i >= 0 and ptr < maps[i][1]:
            total += size
    return total


def batch_for(device: torch.device | str, bytes_per_item: int, *, cap: int, floor: int = 1,
              fraction: float = 0.5) -> int:
    """Largest batch whose working memory (`bytes_per_item` each) fits in `fraction` of the free
    device memory, clamped to [floor, cap]. Off CUDA (free memory unknown) it is `cap`.

    The fraction leaves room for what the estimate misses (allocator slack, temporaries);
    `retry_on_oom` catches the rest.
    """
    free = free_bytes(device)
    if free is None:
        return cap
    return max(floor, min(cap, int(free * fraction) // max(1, bytes_per_item)))


def retry_on_oom(run: Callable[[int], T], batch: int) -> T:
    """run(batch), halving the batch on a CUDA out-of-memory error until batch 1 fails too.

    `run` must be safe to call again (no half-written output): a failed attempt is discarded.
    """
    while True:
        try:
            return run(batch)
        except torch.cuda.OutOfMemoryError:
            if batch <= 1:
                raise
            batch //= 2
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
