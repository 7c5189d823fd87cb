"""Issue 15: Qwen2.5-Coder-1.5B-Instruct inverted at layers 1, 14 and 28 from plain transformers states.

Prompts: 20 tokens each from three kinds of text (`sipit bench invert`'s: prose, code from the half
of the standard library the calibration never reads, random ids). States: ONE `model(ids, output_hidden_states=True)` forward of all prompts
(transformers' own hidden_states; its last entry carries the final norm, so layer 28 is inverted
with final_norm). The learned policy is calibrated with `--calibration fast` (a full position-0 table
is 151,936 tokens through 28 blocks: over an hour on 2 cores), all three taps in one pass.

    PYTHONPATH=src python docs/results/qwen/invert_qwen.py -o docs/results/qwen/invert.json
    PYTHONPATH=src python docs/results/qwen/invert_qwen.py --seed 11 -o docs/results/qwen/invert-seed11.json
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import torch

from sipit.bench.invert import prompts as bench_prompts
from sipit.environment import environment, finished
from sipit.invert import InvertConfig, invert
from sipit.invert.learned import LearnedConfig
from sipit.invert.learned.fit import calibrate_cached_taps
from sipit.io import write_json
from sipit.models import LayerTap, load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--per-kind", type=int, default=3, help="prompts per kind (prose, held-out code, random ids)")
    ap.add_argument("--layers", default="1,14,28")
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7, help="prompt sampling seed (7: the committed invert.json)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    env = environment(shlex.join(["python", *sys.argv]))
    t0 = time.perf_counter()
    lm = load_model(args.model)
    load_seconds = time.perf_counter() - t0
    prompts = bench_prompts(lm, ["prose", "code", "random"], args.per_kind, args.length, seed=args.seed)  # [(kind, ids)]
    ids = torch.tensor([p for _, p in prompts])
    with torch.no_grad():
        t0 = time.perf_counter()
        hidden = lm.model(input_ids=ids, output_hidden_states=True).hidden_states  # L+1 x [B, T, d]
        forward_seconds = time.perf_counter() - t0
    fast = LearnedConfig.fast()
    taps = [LayerTap(lm, layer, final_norm=layer == lm.n_layers) for layer in map(int, args.layers.split(","))]
    t0 = time.perf_counter()
    fitted = calibrate_cached_taps(lm, taps, fast)
    calibration_seconds = time.perf_counter() - t0
    out = dict(model=lm.name, commit=env["commit"], seed=args.seed, fingerprint=lm.fingerprint, per_kind=args.per_kind, length=args.length,
               threads=args.threads, model_load_seconds=round(load_seconds, 1),
               forward_seconds_all_prompts_all_layers=round(forward_seconds, 3),
               calibration="fast", calibration_seconds_one_pass=round(calibration_seconds, 1),
               calibrations_fitted=[k for k, s in fitted.items() if s > 0], layers={})
    for tap in taps:
        states = [hidden[tap.layer][i] for i in range(len(prompts))]
        res = invert(lm, states, tap.layer, InvertConfig(learned=fast), final_norm=tap.final_norm,
                     progress=False, true_ids=[p for _, p in prompts])
        by_source = {}
        for (kind, _), q in zip(prompts, res.prompts):
            by_source.setdefault(kind, []).append(q)
        out["layers"][tap.key] = dict(
            summary=res.summary(),
            by_source={s: dict(exact=sum(bool(q.exact) for q in qs), prompts=len(qs),
                               seconds_median=round(statistics.median(q.seconds for q in qs), 3),
                               statuses=[q.status for q in qs]) for s, qs in by_source.items()},
            prompts=[dict(source=kind, exact=bool(q.exact), status=q.status, message=q.message, seconds=round(q.seconds, 3),
                          text=q.text) for (kind, _), q in zip(prompts, res.prompts)])
        s = res.summary()
        print(f"{tap.key}: {sum(bool(q.exact) for q in res.prompts)}/{len(prompts)} exact, ok {s['ok']} ambiguous "
              f"{s['ambiguous']} failed {s['failed']}, median {s['seconds_per_prompt_median']} s/prompt, "
              f"{s['candidates_per_position']} candidates/position", flush=True)
        out["environment"] = finished(dict(env))
        write_json(args.output, out)  # after every layer: a stopped run keeps the layers it finished


if __name__ == "__main__":
    main()
