"""Benchmarks: each module has a `Config` dataclass, `run(config) -> dict` and `main(argv)` (prints JSON)."""
import argparse
from dataclasses import fields

from ..models.device import sync  # noqa: F401 (the benches' clock)


def parse_config(config_class, argv, prog: str, description: str):
    """A `config_class` instance from command-line options named after its fields (--prefix-len ...)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    for f in fields(config_class):
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=f.default)
    return config_class(**vars(p.parse_args(argv)))

