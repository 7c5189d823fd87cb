"""The table of docs/results/identify/README.md from identify_check.py's JSONL files: python summarize.py FILE..."""
import json
import statistics
import sys
from collections import Counter

for path in sys.argv[1:]:
    lines = [json.loads(line) for line in open(path)]
    head, fit = lines[0], lines[1]
    rows = [r for r in lines if "outcome" in r]
    print(f"## {head['model']}, seed {head['seed']}, commit {head['commit']}: layers {head['layers']}, "
          f"screens fitted in {fit['screens_seconds']} s; first tokens {head['first_tokens']}")
    for dtype in ("float32", "bfloat16"):
        for files in (["prose", "code", "chat", "random"], ["all four"]):
            sel = [r for r in rows if r["dtype"] == dtype and r["file"] in files]
            count = Counter(r["outcome"] for r in sel)
            exact = [r for r in sel if r["outcome"] == "exact"]
            missed = sorted({(r["file"], r["layer"], r["final_norm"]) for r in sel if r["outcome"] != "exact"})
            matched = (f"matched distance ≤ {max(r['distance'] for r in exact) / exact[0]['tolerance']:.2f} × "
                       "tolerance, " if len(files) > 1 else "")  # (a four-prompt file's is its prompts' median)
            print(f"{dtype:8s} {'one-prompt files' if len(files) > 1 else 'four-prompt files':17s} "
                  f"{dict(count)}  exact {len(exact)}/{len(sel)}; {matched}"
                  f"runner-up ≥ {min(r['runner_up_distance'] / r['tolerance'] for r in exact):.1f} × tolerance; "
                  f"median {statistics.median(r['seconds'] for r in sel):.2f} s, max {max(r['seconds'] for r in sel):.2f} s"
                  + (f"; not matched: {missed}" if missed else ""))
    print()
