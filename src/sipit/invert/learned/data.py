"""The calibration corpus: offline text that ships with Python, the model's own samples, and uniform random ids.

The reference manual (`pydoc_data.topics`) and half of the standard library's source files (those
whose path hashes even; benchmarks draw code from the other half, so it stays unseen). That is manuals and
code only, so part of the text rows are the model's own samples (model_samples): prose, dialogue, lists, in
the model's own distribution. Never the prompts being inverted.
"""
from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from pathlib import Path

import torch
from torch import Tensor

from ...models.load import cache_dir


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


def calibration_ids(lm, n_tokens: int, seq_len: int = 64, random_fraction: float = 0.2, seed: int = 0,
                    sampled_fraction: float = 0.0) -> Tensor:
    """Rows of seq_len ids: the model's own samples (sampled_fraction of the tokens, model_samples), text spans of
    shuffled documents, then uniform random-id rows (random_fraction). [N, seq_len]

    A model without a tokenizer (random:<arch>: ids in, ids out) has no text: all rows are random ids,
    which is also what its prompts are."""
    rng = random.Random(seed)
    texts = calibration_texts() if lm.tokenizer is not None else []
    rng.shuffle(texts)
    if not texts:
        random_fraction, sampled_fraction = 1.0, 0.0
    n_random = int(n_tokens * random_fraction) // seq_len
    n_sampled = int(n_tokens * sampled_fraction) // seq_len if samples_possible(lm) else 0
    n_text = max(1, n_tokens // seq_len - n_random - n_sampled) if texts else 0
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
    sampled = cached_samples(lm, n_sampled, seq_len, seed) if n_sampled else rand[:0]
    return torch.cat([sampled, torch.tensor(rows, dtype=torch.long).view(-1, seq_len), rand])


def samples_possible(lm) -> bool:
    """Whether the model can sample text: a tokenizer with a start token, and every block and the LM head loaded
    (not a max_layer cut)."""
    return _start_id(lm) is not None and lm.n_layers == lm.depth


def cached_samples(lm, rows: int, seq_len: int, seed: int = 0) -> Tensor:
    """model_samples, made once per model (its fingerprint) and kept in the cache: every later calibration of that
    model, at any layer, reads them. [rows, seq_len]"""
    path = cache_dir() / "samples" / f"{lm.fingerprint}-{rows}x{seq_len}-{seed}.pt"
    if path.exists():
        try:
            ids = torch.load(path)
            if ids.shape == (rows, seq_len):
                return ids
        except Exception:  # (a damaged file is made again)
            pass
    ids = model_samples(lm, rows, seq_len, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(ids, tmp)
    os.replace(tmp, path)  # (atomic: a killed save leaves no half file under the name)
    return ids


def _start_id(lm) -> int | None:
    """The token samples start after: the tokenizer's beginning-of-sequence token, else its end-of-sequence one."""
    tok = lm.tokenizer
    if tok is None:
        return None
    return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id


@torch.no_grad()
def model_samples(lm, rows: int, seq_len: int, seed: int = 0, batch: int = 256) -> Tensor:
    """The model's own text: rows sampled from it at temperature 1 after its start token (_start_id; the
    tokenizer's special tokens never drawn), all rows a step at a time on a KV cache, seeded. [rows, seq_len]
    on the CPU.

    The calibration corpus is manuals and code; a forward model fitted on them alone misranks what they lack.
    SmolLM2, full calibrations with a third of their rows such samples (LearnedConfig.sampled_fraction) against
    none, wrong first guesses of the bench prompts (760 positions a seed): layer 15, seeds 17 / 71 / 73 28 / 32 / 34
    -> 22 / 13 / 29, fresh seeds 503 / 509 / 521 28 / 27 / 26 -> 18 / 15 / 14 (one-pass prompts 70 -> 86 of 120);
    layer 30 574 -> 505 and 629 -> 555 (code worse: 82 -> 111 on the fresh seeds). More rows of the corpus instead
    did not help (docs/results/invert/model_samples.py and README.md)."""
    from tqdm import tqdm

    special = lm.special_ids().to(lm.device)
    g = torch.Generator().manual_seed(seed)
    out = []
    for b in range(0, rows, batch):
        n = min(batch, rows - b)
        cache, x, drawn = lm.new_cache(), torch.full((n, 1), _start_id(lm), device=lm.device), []
        for _ in tqdm(range(seq_len), desc=f"calibration {lm.name}: the model's own samples", leave=False, disable=None):
            x = draw(lm.logits(x, cache)[:, -1, :lm.vocab_size], special, g)  # (a head may have padding columns)
            drawn.append(x.cpu())
        out.append(torch.cat(drawn, 1))
    return torch.cat(out) if out else torch.zeros(0, seq_len, dtype=torch.long)


def random_ids(vocab_size: int, rows: int, length: int, seed: int) -> Tensor:
    """Uniform random ids. [rows, length]"""
    return torch.randint(0, vocab_size, (rows, length), generator=torch.Generator().manual_seed(seed))


def draw(logits: Tensor, never: Tensor, g: torch.Generator) -> Tensor:
    """One token per row of logits [n, V] at temperature 1, the ids `never` excluded, by inverse CDF with uniform draws
    from g (on the CPU, whatever the device: seeded alike). torch.multinomial took 3/4 of the sampling time. [n, 1]"""
    cdf = logits.float().index_fill(1, never, -torch.inf).softmax(1).cumsum_(1)  # [n, V]
    u = torch.rand(len(cdf), 1, generator=g).to(cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).clamp_max_(cdf.shape[1] - 1)
