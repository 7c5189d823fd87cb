"""The search's other ranker after the first batch (LinearRanker.free_scores), this code's against what it was and
against variants tried, all patched in one process (the loop's passes are deterministic: each variant's candidates,
passes and exactness are what that code gives; seconds are timed alternating).

- base: the code before (4e6d7cf): the other ranker no anchors, the LM prior flipped, with the norm term;
- A / B / C: in every batch, the first too, the other ranker without its norm term, with the main ranker's prior
  (A), the flipped one (B), none (C);
- E: this code: the first batch's other ranker as before, from the second on the linear model alone, no norm term.

    python normfree_ab.py cases VARIANTS              e.g. base,A,B,C,E: the seven slowest prompts of seeds 389 and
                                                      293 at layer 30 (a position each searched 2,128-49,152 deep)
    python normfree_ab.py bench LAYER SEED VARIANTS   the bench prompts of a seed, 10 per source, alternating"""
import sys

from common import alternate, bench_prompts, smollm2

from sipit.invert import InvertConfig, SipIt
from sipit.invert.eps import tolerance_for
from sipit.invert.learned.config import calibration_config
from sipit.invert.learned.ranker import LinearRanker
from sipit.models import LayerTap

CODE = {name: getattr(LinearRanker, name) for name in ("ranking", "first_scores", "free_scores")}
VARIANT = {"v": "E"}


def other_prior(ranker, prior: bool) -> bool:
    v = VARIANT["v"]
    flipped = (not prior) and ranker.cal.has_prior
    return prior if v == "A" else flipped if v in ("base", "B") else False


def ranking(self, target, t, prior, *args, **kwargs):
    self.main_prior = prior  # (for free_scores below)
    yield from CODE["ranking"](self, target, t, prior, *args, **kwargs)


def free_scores(self, target, t):
    if VARIANT["v"] == "E":
        return CODE["free_scores"](self, target, t)
    s = self.scores(target, t, False)
    if other_prior(self, self.main_prior):
        s.add_(self.lm_scores(target, t), alpha=2 * self.cal.lm_weight)
    return s if VARIANT["v"] == "base" else s.add_(self.cal.P_sq, alpha=self.gain ** 2)


def first_scores(self, requests):
    if VARIANT["v"] in ("base", "E"):
        return CODE["first_scores"](self, requests)
    other = [(target, t, other_prior(self, prior), None) for target, t, prior, _ in requests]
    s = self.scores_many(list(requests) + other, self.screen_top)
    return list(zip(s[:len(requests)], s[len(requests):].add_(self.cal.P_sq, alpha=self.gain ** 2)))


def apply(variant: str) -> None:
    VARIANT["v"] = variant
    LinearRanker.ranking, LinearRanker.free_scores, LinearRanker.first_scores = ranking, free_scores, first_scores


def bench(layer: int, seed: int, variants: list[str]) -> None:
    alternate(layer, seed, 20, {v: (lambda v: lambda engine: apply(v))(v) for v in variants}, per_source=10, repeats=1)


def cases(variants: list[str]) -> None:
    lm = smollm2()
    tap = LayerTap(lm, 30)
    engine = None
    for seed, chosen in {389: [23, 24, 27, 28], 293: [1, 26, 28]}.items():
        data, ids, states = bench_prompts(lm, tap, seed)
        if engine is None:
            engine = SipIt(lm, 30, InvertConfig(learned=calibration_config("full")),
                           eps=tolerance_for(tap, {states[0].dtype}).eps)
            engine.invert_prompt(states[0])  # warm-up
        for i in chosen:
            out = []
            for v in variants:
                apply(v)
                r = engine.invert_prompt(states[i], ids[i].tolist())
                deep = [(t, q.tried) for t, q in enumerate(r.positions) if q.tried > 50]
                out.append(f"{v}: {r.seconds:.1f} s, exact {r.exact}, {r.status}, {r.tap_calls} passes, searched {deep}")
            print(f"seed {seed} prompt {i} ({data[i][0]}): " + " | ".join(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "bench":
        bench(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(","))
    else:
        cases(sys.argv[2].split(","))
