"""The calibration corpus: offline text that ships with Python, plus uniform random ids.

The reference manual (`pydoc_data.topics`) and half of the standard library's source files (those
whose path hashes even; benchmarks draw code from the other half, so it stays unseen). Never the
prompts being inverted.
"""
from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from pathlib import Path

import torch
from torch import Tensor


def stdlib_files(calibration_half: bool) -> list[Path]:
    """Standard-library .py files (no tests), split in two halves by a hash of the relative path."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for r, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__", "test",
                                                         "tests", "idle_test"))
        for n in sorted(names):
            if n.endswith(".py"):
                rel = os.path.relpath(os.path.join(r, n), root)
                if (hashlib.sha1(rel.encode()).digest()[0] % 2 == 0) == calibration_half:
                    out.append(Path(root) / rel)
    return out


def calibration_texts() -> list[str]:
    from pydoc_data.topics import topics

    texts = [topics[k] for k in sorted(topics)]
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_files(calibration_half=True)]
    return texts


def calibration_ids(lm, n_tokens: int, seq_len: int = 64, random_fraction: float = 0.2, seed: int = 0) -> Tensor:
    """Rows of seq_len ids: text spans of shuffled documents, then uniform random-id rows. [N, seq_len]

    A model without a tokenizer (random:<arch>: ids in, ids out) has no text: all rows are random ids,
    which is also what its prompts are."""
    rng = random.Random(seed)
    texts = calibration_texts() if lm.tokenizer is not None else []
    rng.shuffle(texts)
    if not texts:
        random_fraction = 1.0
    n_random = int(n_tokens * random_fraction) // seq_len
    n_text = max(1, n_tokens // seq_len - n_random) if texts else 0
    rows, stream = [], []
    for text in texts:
        stream += lm.encode(text)
        while len(stream) >= seq_len and len(rows) < n_text:
            rows.append(stream[:seq_len])
            stream = stream[seq_len:]
        if len(rows) >= n_text:
            break
    g = torch.Generator().manual_seed(seed)
    rand = torch.randint(0, lm.vocab_size, (n_random, seq_len), generator=g)
    return torch.cat([torch.tensor(rows, dtype=torch.long).view(-1, seq_len), rand])


def random_ids(vocab_size: int, rows: int, length: int, seed: int) -> Tensor:
    """Uniform random ids. [rows, length]"""
    return torch.randint(0, vocab_size, (rows, length), generator=torch.Generator().manual_seed(seed))
