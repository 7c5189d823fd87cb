"""A/B of the lens prior (LearnedConfig.lens_rows) at layer LAYER: the same full calibration with and without
it, two engines in one process, alternating on each seed's bench prompts (10 per source).

    python lens_ab.py LAYER SEEDS            e.g. 15 5,1,7,13,17,23

Prints per seed and arm: wrong first guesses (ranker.guesses, of 760) and prompts with none, the median and
mean ratio (each prompt's seconds ÷ a forward of it timed in the same run) and per source, one-pass prompts;
then a lock-step batch of 32, two runs each (seconds ÷ one batched forward). Every inversion must be exact."""
import statistics, sys, time, torch
from dataclasses import replace
from sipit.bench.invert import prompts, interleaved
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
torch.set_num_threads(2)
layer = int(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]; mode = sys.argv[3] if len(sys.argv) > 3 else "full"
lm = load_model("smollm2"); tap = LayerTap(lm, layer)
full = calibration_config(mode)
cfgs = {"lens": InvertConfig(policy="learned", learned=full), "plain": InvertConfig(policy="learned", learned=replace(full, lens_rows=0))}
for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    tids = torch.tensor([p for _, p in data]); states = tap.states(tids)
    eps = tolerance_for(tap, {states.dtype}).eps
    eng = {k: SipIt(lm, layer, c, eps=eps) for k, c in cfgs.items()}
    for k, e in eng.items():
        wrong = [int((g != p[1:]).sum()) for (g, _), p in zip(e.policy.ranker.guesses([s.float() for s in states]), tids)]
        print(f"L{layer} seed {seed} {k}: {sum(wrong)} wrong first guesses, {sum(w == 0 for w in wrong)}/40 prompts with none")
    for s in states[:2]:
        for e in eng.values(): e.invert_prompt(s)
    sec = {k: [] for k in eng}; fwd = []; one = {k: 0 for k in eng}
    for i, (s, p) in enumerate(zip(states, tids)):
        t = time.perf_counter(); tap.states(p); fwd.append(time.perf_counter() - t)
        for name in (list(eng) if i % 2 else list(eng)[::-1]):
            r = eng[name].invert_prompt(s, p.tolist())
            assert r.ids == p.tolist() and r.status == "ok", (name, i, r.status)
            sec[name].append(r.seconds); one[name] += all(q.via == "speculation" for q in r.positions)
    f = statistics.median(fwd)
    for k in eng:
        rs = [x / f for x in sec[k]]
        by = {kind: round(statistics.median(rs[j] for j in range(len(rs)) if data[j][0] == kind), 2) for kind in ("prose", "code", "random", "chat")}
        print(f"L{layer} seed {seed} {k}: median ratio {statistics.median(rs):.2f} mean {statistics.mean(rs):.2f} {by} one-pass {one[k]}/40", flush=True)
    order = interleaved(data)[:32]
    lock = {k: [] for k in eng}
    for rep in range(2):
        t = time.perf_counter(); tap.states(tids[order]); fb = time.perf_counter() - t
        for name in (list(eng) if rep % 2 else list(eng)[::-1]):
            t = time.perf_counter(); res = eng[name].invert_prompts([states[j] for j in order]); lock[name].append((time.perf_counter() - t) / fb)
            assert all(r.ids == tids[j].tolist() for r, j in zip(res, order))
    print("   B=32:", {k: [round(x, 2) for x in v] for k, v in lock.items()}, flush=True)
