"""Errors and atomic file writing shared by every job: nothing is ever half-written."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


class SipitError(Exception):
    """A user-facing error: the CLI prints its message and exits non-zero."""


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to `path` via a temporary file in the same directory and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, obj) -> Path:
    return atomic_write(path, json.dumps(obj, indent=2) + "\n")


def write_jsonl(path: str | Path, rows) -> Path:
    return atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())
