"""ε measured, not assumed: the recomputation noise of a tap, per position, and the ε it implies.

The loop recomputes states along other paths than the one that produced the observation: a KV
cache and a speculative multi-token pass instead of one full forward, candidate batches (padded or
flat: models/tap.py) instead of a single sequence, lock-step passes over many prompts' prefixes at once
(tap.extend_many), and the observation itself may come from a batched forward. On a few seeded
random-id calibration prompts, every path is compared with one single full forward *per position*
(one norm over a whole [T, d] tensor would be dominated by position 0's massive activation):

    noise_t = max over paths and prompts of ‖h_t(path) − h_t(full)‖ / ‖h_t(full)‖
    ε       = tolerance(dtype, FACTOR × max(max_t noise_t, FLOOR_ULPS × u_fp32))  (+ the dtype rounding)
              + observation_error

with FACTOR = 50 for float32/64 models and 4 for bf16/fp16 ones. observation_error is what the file
adds beyond recomputation and is known from how it was made, not measured: a storage format's
rounding bound (storage.py), that bound amplified by the least squares from logits back to states
(models/surfaces.py), or added noise.

Measured once per (fingerprint of the weights the tap reads, tap key, dtype, device, batch size) and
cached on disk: a load with max_layer finds what the whole model measured.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

import torch

from ..io import write_json
from ..models.load import cache_dir
from .verify import UNIT_ROUNDOFF, rel_distance, tolerance

VERSION = 8  # of the cached noise profile (3: keyed by the blocks the tap reads; 4: flat candidate passes; 5: position
#              1 on the prefixes the loop's own passes leave, alone and in lock-step; 6: ALiBi models' passes keep
#              every key at its position, where flat ones had shifted them: MPT's noise was that of a wrong model;
#              7: 16-bit models' lock-step passes are never flat, whose noise had set SmolLM2 bfloat16's eps to 0.42;
#              8: 16-bit models' prefixes cut from a pass of the whole prompt, as the loop's are)
FACTOR = 50.0  # ε = FACTOR × the largest measured noise: headroom for paths and prompts not measured
#                (SmolLM2 layer 30: position 1 after " proof" showed 3.3e-5 where the calibration measured 4.3e-6)
HALF_FACTOR = 4.0  # the same for bf16/fp16 models, whose rounding dominates every path alike: random:llama-3.1-8b
#                    bf16 on an H100 measured 3.4e-2 at layer 16, and 50× that (1.7) exceeds the distance between
#                    unrelated states (≈ 1.4), so every token would pass
N_PROMPTS, LENGTH = 2, 24  # calibration prompts (seeded uniform random ids)
SINK_TEXT = ("The committee said on Monday that it would publish its findings. In 1998, she moved to Paris; "
             "def main(args):\n    return [x for x in args if x]\n# TODO: fix this\nimport os, sys\n"
             "Yes! No? Maybe... 42 + 7 = 49. <html><body>Hello, world.</body></html> Once upon a time")
SINK_TOKENS = 24  # position 1 right after each of these position-0 tokens (the attention sink) is measured
FLOOR_ULPS = 16  # noise is at least this many float32 unit roundoffs (a path may be bit-exact on the
#                  calibration prompts and not on others); in float32 units whatever the model's dtype, since
#                  16 bf16 ulps × FACTOR would exceed the distance between random vectors (ε ≈ 3)


@dataclass
class Tolerance:
    """The acceptance threshold of one (tap, dtype) and where it comes from."""

    eps: float
    noise: float | None  # largest relative recomputation noise measured (None: ε given by the user)
    noise_per_position: list[float] | None  # max over paths and prompts, position t of the calibration prompts
    factor: float | None
    dtype_roundoff: float  # unit roundoff of the observed states' dtype
    source: str  # "measured" | "given"
    observation_error: float = 0.0  # added to ε: the observations' own error (storage, logits, noise)
    seconds: float = 0.0  # spent on it now: measuring the noise the first time a tap is used, ~0 once cached

    def to_json(self) -> dict:
        return asdict(self)


def sink_pairs(lm, g: torch.Generator) -> torch.Tensor:
    """Up to SINK_TOKENS distinct first tokens of SINK_TEXT, each with the token after it ([n, 2] ids on lm's device);
    for ids-only models (no tokenizer) random first tokens drawn from g."""
    text = torch.tensor(lm.encode(SINK_TEXT)) if lm.tokenizer is not None else \
        torch.randint(lm.vocab_size, (4 * SINK_TOKENS,), generator=g)
    first_at: dict[int, int] = {}
    for i in range(len(text) - 1):
        first_at.setdefault(int(text[i]), i)
    return torch.stack([text[i:i + 2] for i in list(first_at.values())[:SINK_TOKENS]]).to(lm.device)


@torch.no_grad()
def measure_noise(tap, batch_size: int = 256) -> list[float]:
    # (candidate batches of 64 and of 256 rows measured the same noise on SmolLM2 layers 15 and 30)
    """Relative recomputation noise per position t < LENGTH, max over every path the loop uses. [LENGTH]"""
    lm = tap.lm
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(lm.vocab_size, (N_PROMPTS, LENGTH), generator=g).to(lm.device)
    batched = tap.states(ids)  # [N, T, d]: observations captured in a batch
    noise = torch.zeros(LENGTH, dtype=torch.float64)
    half = LENGTH // 2
    sizes = {2, 16, min(64, batch_size)}
    if lm.device.type == "cuda":  # GPU kernels change with the row count: the widest batch too
        sizes.add(batch_size)
    for i in range(N_PROMPTS):
        ref = tap.states(ids[i])  # [T, d] one single full forward
        noise = torch.maximum(noise, rel_distance(batched[i], ref).cpu())
        h, whole = tap.extend(tap.prefill(ids[i, :0]), ids[i][None], keep=True)  # speculation from nothing
        noise = torch.maximum(noise, rel_distance(h[0], ref).cpu())

        def prefix(t: int):
            """The prefix ids[i, :t] as the loop caches it: a 16-bit model's cut from a pass of the whole prompt (the
            loop grows its prefixes from such passes, confirming a search's token by one: SipIt's note below CONFIRM;
            one made alone, its keys computed in a shorter sequence, lay 28% off at Gemma-3-270M's layer 9 in bfloat16
            and made ε 1.13, within which wrong tokens passed), else made alone."""
            return whole(0, t) if lm.half else tap.prefill(ids[i, :t])

        h, _ = tap.extend(prefix(half), ids[i, half:][None], keep=True)  # on a KV cache
        noise[half:] = torch.maximum(noise[half:], rel_distance(h[0], ref[half:]).cpu())
        for t in (0, 1, LENGTH - 1):  # the true token inside candidate batches of several sizes
            prefix_t = prefix(t)
            for size in sorted(sizes):
                cand = torch.randint(lm.vocab_size, (size,), generator=g).to(lm.device)
                j = int(torch.randint(size, (1,), generator=g))
                cand[j] = ids[i, t]
                for layout in ("padded", "flat"):  # (tap.extend chooses by cost, by prefix length and rows)
                    h = tap.extend(prefix_t, cand, layout=layout)  # [B, d]
                    noise[t] = max(float(noise[t]), float(rel_distance(h[j], ref[t])))
    # position 1 on a cached position 0 depends strongly on the token there (SmolLM2 layer 30: 3e-5
    # after "The" vs 3e-6 after random ids) and on the pass that cached it: measure it after many common first
    # tokens, on the prefixes the loop's passes leave
    pairs = sink_pairs(lm, g)  # [n, 2]
    ref = tap.states(pairs)  # [n, 2, d]
    empty = tap.prefill(pairs[:0, 0])

    def seen(h: torch.Tensor, r: torch.Tensor, t: int = 0) -> None:  # h [k, d]: a pair's positions t.., r [2, d]
        noise[t:t + len(h)] = torch.maximum(noise[t:t + len(h)], rel_distance(h, r[t:t + len(h)]).cpu())
    # a prompt alone: the pair as its speculation row, then position 1 searched on the prefix that row leaves (SmolLM2
    # layer 15: 1.2e-5, where the prefix of a one-token pass of its own measured 7.9e-6)
    for pair, r in zip(pairs, ref):
        h, grown = tap.extend(empty, pair[None], keep=True)  # [1, 2, d]
        seen(h[0], r)
        seen(tap.extend(grown(0, 1), pair[1:]), r, 1)
    # lock-step: every pair a row of one pass, then position 1 of all on the prefixes it leaves, in one pass of each
    # layout (tap.extend_many), and alone on each (a prompt alone in a round; SmolLM2 layer 30: 1.3e-5, where the
    # prefix of a one-token pass of its own measured 4.3e-6)
    h, grown = tap.extend(empty, pairs, keep=True)  # [n, 2, d]
    for hb, r in zip(h, ref):
        seen(hb, r)
    prefixes = [grown(b, 1) for b in range(len(pairs))]
    for layout in ("padded", "flat"):
        answers = tap.extend_many([(p, pair[None, 1:]) for p, pair in zip(prefixes, pairs)], layout=layout)
        for (hb, _), r in zip(answers, ref):
            seen(hb[0], r, 1)
    for p, pair, r in zip(prefixes, pairs, ref):
        seen(tap.extend(p, pair[1:]), r, 1)
    return noise.tolist()


_MEMO: dict[str, list[float]] = {}


def noise_profile(tap, batch_size: int = 256) -> list[float]:
    """measure_noise, cached by (fingerprint of the weights the tap reads, tap key, model dtype, device,
    batch size) in memory and on disk."""
    lm = tap.lm
    weights = lm.fingerprint_through(tap.blocks_read)
    name = f"v{VERSION}-{weights}-{tap.key}-{str(lm.dtype).split('.')[-1]}-{lm.device.type}-b{batch_size}"
    if name not in _MEMO:
        path = cache_dir() / "eps" / f"{name}.json"
        try:
            _MEMO[name] = json.loads(path.read_text())["noise_per_position"]
        except (OSError, ValueError, KeyError):
            # (~130 small passes: seconds at a deep layer, where nothing else says what the run is doing)
            print(f"sipit: measuring the recomputation noise that sets eps for {lm.name} {tap.key} (one-time; "
                  f"cached in {path.parent})", file=sys.stderr)
            _MEMO[name] = measure_noise(tap, batch_size)
            write_json(path, dict(noise_per_position=_MEMO[name], tap=tap.key, fingerprint=weights))
    return _MEMO[name]


def tolerance_for(tap, dtypes, eps: float | None = None, batch_size: int = 256,
                  observation_error: float = 0.0) -> Tolerance:
    """The Tolerance for observed states of `dtypes` (the coarsest wins) that carry a relative
    `observation_error` of their own; `eps` given: used as is."""
    u = max(UNIT_ROUNDOFF.get(dt, 2.0 ** -8) for dt in dtypes)
    if eps is not None:
        return Tolerance(eps=eps, noise=None, noise_per_position=None, factor=None, dtype_roundoff=u, source="given")
    start = time.perf_counter()
    per_position = noise_profile(tap, batch_size)
    noise = max(max(per_position), FLOOR_ULPS * UNIT_ROUNDOFF[torch.float32])
    coarsest = max(dtypes, key=lambda dt: UNIT_ROUNDOFF.get(dt, 2.0 ** -8))
    factor = HALF_FACTOR if tap.lm.half else FACTOR
    return Tolerance(eps=tolerance(coarsest, factor * noise) + observation_error, noise=noise,
                     noise_per_position=per_position, factor=factor, dtype_roundoff=u, source="measured",
                     observation_error=observation_error, seconds=round(time.perf_counter() - start, 2))
