"""Wrong first guesses (ranker.guesses) and their time per prompt (all 40 one at a time, median of 3) when the
guesses rescore the screen's best m exactly (LearnedConfig.guess_top), on the bench prompts of each seed.
    python guess_top.py LAYER SEEDS MS        e.g. 15 59,61,67 4,16,64"""
import sys, time, statistics, torch
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer = int(sys.argv[1]); lm = load_model("smollm2"); tap = LayerTap(lm, layer)
rk = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config("full")), eps=1e-4).policy.ranker
for seed in [int(s) for s in sys.argv[2].split(",")]:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    tids = torch.tensor([p for _, p in data]); states = [s.float() for s in tap.states(tids)]
    for m in [int(x) for x in sys.argv[3].split(",")]:
        rk.guess_top = m
        w = [int((g != p[1:]).sum()) for (g, _), p in zip(rk.guesses(states), tids)]
        ms = []
        for _ in range(3):
            a = time.perf_counter()
            for s in states: rk.guesses([s])
            ms.append((time.perf_counter() - a) / len(states) * 1e3)
        print(f"layer {layer} seed {seed} m {m}: wrong {sum(w)} of {19 * len(w)}, prompts with none {sum(x == 0 for x in w)}/{len(w)}, {statistics.median(ms):.2f} ms a prompt", flush=True)
