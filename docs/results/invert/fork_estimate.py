"""What forking the first pass would buy at a layer: per prompt the guesses' runner-ups and margins (the re-ranked score,
lens included, of the best less the second), then for margin thresholds M and at most F forks a prompt: how many
prompts one fork row (the runner-up at a forked position with the guessed continuation, verified in the same pass)
would make one-pass, how many prompts would carry forks, and the extra tokens. An estimate: nothing is inverted.

    python fork_estimate.py LAYER SEEDS full|fast        e.g. 15 5 full"""
import sys, torch
from sipit.bench.invert import prompts
from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.models import LayerTap, load_model
layer, seeds, calib = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
torch.set_num_threads(2)
lm = load_model("smollm2")
tap = LayerTap(lm, layer)
eng = None
Ms = [5, 10, 20, 30, 40, 60]
for seed in seeds:
    data = prompts(lm, ["prose", "code", "random", "chat"], 10, 20, seed)
    ids = torch.tensor([p for _, p in data])
    states = tap.states(ids)
    if eng is None:
        eng = SipIt(lm, layer, InvertConfig(policy="learned", learned=calibration_config(calib)), eps=tolerance_for(tap, {states.dtype}).eps)
    rk = eng.policy.ranker; cal = rk.cal
    rows = []
    for p, s in zip(ids, states):
        s = s.float()
        r = rk.context_residuals(s)
        top, sc = rk.screen_best(r)
        comb = sc.clone()
        if cal.lens_w is not None and top.shape[1] > 1:
            lg = rk.lens_logits(s[:-1], top)
            if rk.lens_text_score(lg) > cal.lens_gate:
                comb = sc + 2 * cal.lm_weight * lg
        if top.shape[1] == 1:
            print("index screen: no runner-up"); sys.exit()
        order = comb.argsort(1, descending=True)
        best = top.gather(1, order[:, :2]); cs = comb.gather(1, order[:, :2])
        rows.append((best, (cs[:, 0] - cs[:, 1]), p[1:]))
    print(f"seed {seed} layer {layer} {calib}: one-pass {sum(bool((b[:,0]==t).all()) for b,_,t in rows)}/40, wrong {sum(int((b[:,0]!=t).sum()) for b,_,t in rows)}")
    for M in Ms:
        for F in (1, 2, 3):
            rescued = forked_prompts = forked_onepass = tokens = 0
            for best, margin, truth in rows:
                wrong = (best[:, 0] != truth).nonzero().flatten().tolist()
                cand = [t for t in margin.argsort().tolist() if margin[t] < M][:F]
                if cand:
                    forked_prompts += 1; forked_onepass += not wrong
                    tokens += sum(len(truth) - t for t in cand)
                if len(wrong) == 1 and wrong[0] in cand and best[wrong[0], 1] == truth[wrong[0]]:
                    rescued += 1
            print(f"  M {M:3d} F {F}: rescued {rescued:2d}, prompts forked {forked_prompts:2d} (one-pass anyway {forked_onepass:2d}), fork tokens {tokens:4d}")
