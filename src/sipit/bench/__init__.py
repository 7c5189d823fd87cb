"""Benchmarks: each module has a `Config` dataclass, `run(config) -> dict` and `main(argv)` (prints JSON)."""
import argparse
from dataclasses import fields

import torch


def parse_config(config_class, argv, prog: str, description: str):
    """A `config_class` instance from command-line options named after its fields (--prefix-len ...)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    for f in fields(config_class):
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=f.default)
    return config_class(**vars(p.parse_args(argv)))


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA runs asynchronously), so a host clock times them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
