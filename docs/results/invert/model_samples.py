"""What the model's own samples in the calibration buy (data.model_samples): SmolLM2's full calibrations without
them (sampled_fraction 0, the calibrations before 2026-11-26) and with them (the default), the wrong first guesses
of the bench prompts of each seed (position 0 and the guesses of every other, as the loop's first pass verifies
them), per source, and the prompts with none (one pass). Nothing inverted; calibrations fitted where not cached.
With `control`, a third calibration: no samples but as many more rows of the corpus (and random ids) as the
samples are, 16,384 tokens (is it the samples or more data?); with `sixth`, one with half as many samples.

    python model_samples.py LAYERS SEEDS [control] [sixth]        e.g. 15,30 17,71,73"""
import sys
import time

import torch

from common import SOURCES, bench_prompts, smollm2
from sipit.invert.learned.config import LearnedConfig
from sipit.invert.learned.fit import load_or_calibrate
from sipit.invert.learned.ranker import LinearRanker
from sipit.models import LayerTap

layers, seeds = [int(s) for s in sys.argv[1].split(",")], [int(s) for s in sys.argv[2].split(",")]
lm = smollm2()
for layer in layers:
    tap = LayerTap(lm, layer)
    arms = [("without samples", LearnedConfig(sampled_fraction=0.0)), ("with samples", LearnedConfig())]
    if "sixth" in sys.argv[3:]:
        arms.append(("a sixth of the rows samples", LearnedConfig(sampled_fraction=1 / 6)))
    if "control" in sys.argv[3:]:
        arms.append(("more corpus rows instead", LearnedConfig(sampled_fraction=0.0, calibration_tokens=49_152 + 16_384)))
    for name, cfg in arms:
        t = time.perf_counter()
        cal, fitted = load_or_calibrate(tap, cfg)
        rk = LinearRanker(cal, tap)
        total, one, rows = 0, 0, []
        for seed in seeds:
            data, ids, states = bench_prompts(lm, tap, seed)
            wrong = dict.fromkeys(SOURCES, 0)
            n_one = 0
            for (kind, p), s in zip(data, states):
                guess = torch.cat([rk.position0(s[:1])[0], rk.guesses([s])[0][0]])
                w = int((guess != torch.tensor(p)).sum())
                wrong[kind] += w
                n_one += w == 0
            rows.append(f"seed {seed} {sum(wrong.values())} ({', '.join(f'{k} {v}' for k, v in wrong.items())}), "
                        f"one-pass {n_one}/{len(data)}")
            total, one = total + sum(wrong.values()), one + n_one
        print(f"layer {layer}, {name} (fitted now: {fitted:.0f} s): wrong first guesses {total}, one-pass {one}; "
              + "; ".join(rows), flush=True)
