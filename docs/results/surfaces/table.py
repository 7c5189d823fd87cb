"""The acceptance table of issue 16 from the runs of acceptance.sh: one row per captured file.

    python docs/results/surfaces/table.py docs/results/surfaces/runs > docs/results/surfaces/runs/table.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(run_dir: Path):
    for summary in sorted(run_dir.glob("*/*.results.summary.json")):
        s = json.loads(summary.read_text())
        name = summary.name.removesuffix(".results.summary.json")
        yield summary.parent.name, name, s


def main(run_dir: str) -> None:
    print("| model | file (surface, layer) | observed | prompts | exact | ok / ambiguous / failed | eps | "
          "s / prompt (median, mean, max) | candidates / position | calibration s (its share of the shared pass) |")
    print("|---|---|---|---:|---:|---|---:|---|---:|---:|")
    for model, name, s in rows(Path(run_dir)):
        exact = round(s["exact_match_rate"] * s["prompts"]) if s["exact_match_rate"] is not None else "?"
        per_prompt = Path(run_dir) / model / f"{name}.results.jsonl"
        slowest = max(json.loads(line)["seconds"] for line in per_prompt.read_text().splitlines() if line.strip())
        print(f"| {model} | {name} | {s['tap']} | {s['prompts']} | {exact} | {s['ok']} / {s['ambiguous']} / "
              f"{s['failed']} | {s['eps']:.3g} | {s['seconds_per_prompt_median']}, {s['seconds_per_prompt_mean']}, "
              f"{slowest:.3g} | {s['candidates_per_position']} | {s['calibration_seconds']} |")


if __name__ == "__main__":
    main(sys.argv[1])
