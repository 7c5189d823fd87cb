"""Benchmarks: each module has a `Config` dataclass, `run(config) -> dict` and `main(argv)` (prints the JSON, with
where it ran: print_result)."""
import argparse
import json
import shlex
import sys
from dataclasses import fields

from ..environment import environment, finished
from ..models.device import sync  # noqa: F401 (the benches' clock)


def parse_config(config_class, argv, prog: str, description: str):
    """A `config_class` instance from command-line options named after its fields (--prefix-len ...)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    for f in fields(config_class):
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=f.default)
    return config_class(**vars(p.parse_args(argv)))


def print_result(run, prog: str, argv: list[str] | None, indent: int = 1) -> None:
    """Run a benchmark (run() -> its result) and print it as JSON with its `environment`: the command as run (prog
    and argv), the sipit commit, the machine, threads and load average at start and end (sipit.environment)."""
    env = environment(shlex.join([*prog.split(), *(sys.argv[1:] if argv is None else argv)]))
    result = run()
    result["environment"] = finished(env)
    print(json.dumps(result, indent=indent))
