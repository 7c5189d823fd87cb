"""Where and when a measurement ran, kept beside its numbers: the command, the sipit commit it ran from, the
machine, threads and load average. Every `sipit bench` JSON and `sipit reproduce` result carries one, so a
committed result says which code on which machine produced it (timings on a shared 2-core machine move with its
load)."""
from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent  # the sipit package this runs from


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or ""


def _git(source: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit(source: Path = SOURCE) -> str | None:
    """The git commit (12 hex digits) of the checkout whose tracked files include `source`'s __init__.py, with
    "+dirty" where tracked files under `source` (the package's code, not the docs beside it) differ from it; None
    where git does not track it (an installed wheel, a site-packages inside someone else's repository, no git)."""
    if _git(source, "ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    head = _git(source, "rev-parse", "--short=12", "HEAD")
    if head is None:
        return None
    changed = _git(source, "status", "--porcelain", "--untracked-files=no", "--", ".")
    return head + ("+dirty" if changed else "")


def environment(command: str) -> dict:
    """The command, the code (commit, version), the machine and its load at the start of a run (finished adds
    what holds at its end)."""
    try:
        sipit_version = version("sipit")
    except PackageNotFoundError:
        sipit_version = None
    return dict(command=command, commit=commit(), version=sipit_version,
                date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), torch_threads=torch.get_num_threads(),
                cpus=os.cpu_count(), cpu=cpu_name(), python=platform.python_version(), torch=torch.__version__,
                platform=platform.platform(), load_average_start=load_average())


def finished(env: dict) -> dict:
    """env (environment's) with what holds at the end of the run: the threads torch ran on (a run may set them)
    and load_average_end."""
    env.update(torch_threads=torch.get_num_threads(), load_average_end=load_average())
    return env
